"""The one place secrets are redacted: URLs' userinfo and secret-named query values."""

from __future__ import annotations

from openhub.redact import redact_text, redact_url


def test_userinfo_and_secret_query_values_are_redacted() -> None:
    url = "https://svc:hunter2@billing.example/customers?api_key=k-123&page=2&token=t&Signature=s"
    assert redact_url(url) == "https://***@billing.example/customers?api_key=***&page=2&token=***&Signature=***"
    assert redact_url(redact_url(url)) == redact_url(url)


def test_a_url_without_secrets_is_unchanged() -> None:
    for url in ("https://billing.example/customers?page=2&sort=name", "http://127.0.0.1:8765/b", "http://h/p?a=%20b"):
        assert redact_url(url) == url


def test_every_url_in_an_error_text_is_redacted() -> None:
    text = ("Traceback (most recent call last):\n  ...\nhttpx.HTTPStatusError: Server error '503 Service Unavailable' "
            "for url 'http://u:p@crm.example/hook?token=abc'\nFor more information check: https://developer.mozilla.org/x")
    out = redact_text(text)
    assert "u:p" not in out and "abc" not in out
    assert "for url 'http://***@crm.example/hook?token=***'" in out
    assert redact_text(out) == out
    assert "https://developer.mozilla.org/x" in out
    assert redact_text(None) is None and redact_text("no url here") == "no url here"
