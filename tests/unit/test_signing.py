"""Standard Webhooks signing and checking (openhub.signing) without a network: the timestamp tolerance,
missing headers, secret forms, and a malformed secret refused at load time without being echoed."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

import pytest

from openhub.config import Settings
from openhub.errors import ConfigurationError, WebhookSignatureError
from openhub.signing import secret_keys, signature_headers, verify_signature

SENT = 1_700_000_000
AT_SEND = datetime.fromtimestamp(SENT, timezone.utc)
BODY = b'{"id":7,"state":"FAILED"}'


def _signed(secret: str) -> dict[str, str]:
    return signature_headers(secret_keys(secret), "openhub:7:FAILED:3", SENT, BODY)


def test_a_signature_verifies_within_the_tolerance_and_not_beyond_it() -> None:
    headers = _signed("s3cret")
    verify_signature("s3cret", headers, BODY, now=AT_SEND + timedelta(minutes=4))
    with pytest.raises(WebhookSignatureError, match="ago"):  # a replay of an old delivery
        verify_signature("s3cret", headers, BODY, now=AT_SEND + timedelta(minutes=6))
    with pytest.raises(WebhookSignatureError, match="ahead"):
        verify_signature("s3cret", headers, BODY, now=AT_SEND - timedelta(minutes=6))
    verify_signature("s3cret", headers, BODY, tolerance=timedelta(minutes=10), now=AT_SEND + timedelta(minutes=6))


def test_a_missing_header_or_an_id_changed_is_refused() -> None:
    headers = _signed("s3cret")
    for name in headers:
        with pytest.raises(WebhookSignatureError, match=f"no {name}"):
            verify_signature("s3cret", {k: v for k, v in headers.items() if k != name}, BODY, now=AT_SEND)
    with pytest.raises(WebhookSignatureError, match="no webhook signature matches"):
        verify_signature("s3cret", {**headers, "webhook-id": "openhub:8:FAILED:3"}, BODY, now=AT_SEND)
    upper = {k.upper(): v for k, v in headers.items()}  # header names are case-insensitive
    verify_signature("s3cret", upper, BODY, now=AT_SEND)


def test_a_whsec_secret_is_its_base64_key_and_a_plain_one_its_bytes() -> None:
    encoded = base64.b64encode(b"raw key bytes").decode()
    assert secret_keys(f"whsec_{encoded} plain") == (b"raw key bytes", b"plain")
    assert secret_keys("whsec_" + encoded.rstrip("=")) == (b"raw key bytes",)  # padding dropped by the issuer
    assert secret_keys("") == ()
    assert signature_headers((), "id", SENT, BODY) == {}


def test_a_malformed_secret_fails_at_load_without_being_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENHUB_WEBHOOK_SECRET", "whsec_not*base64!")
    with pytest.raises(ConfigurationError, match="OPENHUB_WEBHOOK_SECRET") as raised:
        Settings.from_env()
    assert "not*base64" not in str(raised.value)
    monkeypatch.setenv("OPENHUB_WEBHOOK_SECRET", "old-secret new-secret")
    settings = Settings.from_env()
    assert settings.webhook_secrets == (b"old-secret", b"new-secret")
    assert "old-secret" not in repr(settings)
