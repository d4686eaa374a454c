"""Standard Webhooks signing and checking (openhub.core.signing) without a network: the timestamp tolerance,
missing headers, secret forms, and a malformed secret refused at load time without being echoed."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

import pytest

from openhub.core.config import Settings
from openhub.core.errors import ConfigurationError, WebhookSignatureError
from openhub.core.signing import secret_keys, signature_headers, verify_signature

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
    old, new = "old-secret-" + "o" * 21, "new-secret-" + "n" * 21
    monkeypatch.setenv("OPENHUB_WEBHOOK_SECRET", f"{old} {new}")
    settings = Settings.from_env()
    assert settings.webhook_secrets == (old.encode(), new.encode())
    assert old not in repr(settings)


WEAK = ["s3cret", "x", "whsec_" + base64.b64encode(b"short key").decode(), "change-me-webhook-secret-0123456789abcdef"]


@pytest.mark.parametrize("weak", WEAK)
def test_a_weak_or_placeholder_secret_is_refused_like_an_api_key(monkeypatch: pytest.MonkeyPatch, weak: str) -> None:
    """Issue 34 L3: a 1-character or `change-me-…` webhook secret was accepted; API keys need 32+ characters."""
    from openhub.outbound.notify import webhook

    for name, value in (("OPENHUB_WEBHOOK_SECRET", weak), ("OPENHUB_CONFIRM_SECRETS", f"CRM={weak}")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ConfigurationError, match=name) as raised:
            Settings.from_env()
        assert weak not in str(raised.value)
        monkeypatch.delenv(name)
    with pytest.raises(ConfigurationError, match="the secret of the webhook"):
        webhook("http://receiver.example/hook", secret=weak)
    secret_keys(weak)  # a receiver's verify_signature parses it still: the hub never signs with it


def test_each_source_system_has_its_own_confirmation_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    crm, shop, ops = ("whsec_" + base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2, 3))
    monkeypatch.setenv("OPENHUB_WEBHOOK_SECRET", ops)
    monkeypatch.setenv("OPENHUB_CONFIRM_SECRETS", f"CRM={crm},SHOP={shop},CRM={'r' * 32}")
    settings = Settings.from_env()
    assert settings.confirm_secrets == {"CRM": (bytes([1]) * 32, b"r" * 32), "SHOP": (bytes([2]) * 32,)}
    assert crm not in repr(settings)
    for shared in (f"CRM={crm},SHOP={crm}", f"CRM={ops}"):  # one system could forge another's, or the operators'
        monkeypatch.setenv("OPENHUB_CONFIRM_SECRETS", shared)
        with pytest.raises(ConfigurationError, match="the same secret") as raised:
            Settings.from_env()
        assert crm not in str(raised.value) and ops not in str(raised.value)


def test_a_replay_within_the_tolerance_is_refused_and_a_retry_is_not() -> None:
    """Issue 34 L3: the same signed request was accepted any number of times within 5 minutes, although
    README says a receiver can refuse replays."""
    from openhub.core.signing import ReplayCache

    replays = ReplayCache(clock=lambda: SENT + 60)
    headers = _signed("s3cret")
    verify_signature("s3cret", headers, BODY, now=AT_SEND, replays=replays)
    with pytest.raises(WebhookSignatureError, match="a replay"):
        verify_signature("s3cret", headers, BODY, now=AT_SEND + timedelta(minutes=1), replays=replays)
    # The hub's retry of the same notification: the same webhook-id, signed anew at another time.
    retry = signature_headers(secret_keys("s3cret"), "openhub:7:FAILED:3", SENT + 60, BODY)
    verify_signature("s3cret", retry, BODY, now=AT_SEND + timedelta(minutes=1), replays=replays)
    # A forgery (no valid signature) is not noted: it cannot take the genuine request's place.
    forged = {**_signed("s3cret"), "webhook-timestamp": str(SENT + 120)}
    with pytest.raises(WebhookSignatureError, match="no webhook signature"):
        verify_signature("s3cret", forged, BODY, now=AT_SEND, replays=replays)
    genuine = signature_headers(secret_keys("s3cret"), "openhub:7:FAILED:3", SENT + 120, BODY)
    verify_signature("s3cret", genuine, BODY, now=AT_SEND + timedelta(minutes=2), replays=replays)


def test_the_replay_cache_is_bounded_and_forgets_what_is_over() -> None:
    from openhub.core.signing import ReplayCache

    replays = ReplayCache(capacity=3, clock=lambda: 2_000_000_000.0)
    future = 4_000_000_000.0
    assert all(replays.first_time(f"r{n}", future) for n in range(5))
    assert not replays.first_time("r4", future) and replays.first_time("r0", future)  # r0 was pushed out
    assert replays.first_time("past", 1.0) and replays.first_time("past", 1.0)  # over at once: not kept
