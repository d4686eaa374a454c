"""The one place secrets are redacted: URLs' userinfo and secret-named query values, headers, bodies."""

from __future__ import annotations

import json
import sys

import pytest

from openhub.config import Settings
from openhub.errors import ConfigurationError
from openhub.redact import REDACTED, redact_body, redact_headers, redact_text, redact_url


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


def test_configured_header_names_are_redacted_on_top_of_the_built_in_ones() -> None:
    headers = [("X-Vendor-Ref", "v-1"), ("x-tenant", "t-1"), ("Authorization", "x"), ("Accept", "json")]
    assert redact_headers(headers, names=["x-vendor-ref", "X-TENANT"]) == {
        "X-Vendor-Ref": "[redacted]", "x-tenant": "[redacted]", "Authorization": "[redacted]", "Accept": "json"}
    # The configured list only adds: the built-in names stay redacted whatever it holds.
    assert redact_headers([("Authorization", "x"), ("X-Vendor-Ref", "v-1")], names=[]) == {
        "Authorization": "[redacted]", "X-Vendor-Ref": "v-1"}


def test_settings_read_the_redaction_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENHUB_REDACT_HEADERS", " X-Vendor-Ref, x-tenant ,")
    monkeypatch.setenv("OPENHUB_REDACT_BODIES", "ALL")
    settings = Settings.from_env()
    assert settings.redact_headers == {"x-vendor-ref", "x-tenant"} and settings.redact_bodies == "all"
    monkeypatch.delenv("OPENHUB_REDACT_BODIES")
    assert Settings.from_env().redact_bodies == "fields"
    monkeypatch.setenv("OPENHUB_REDACT_BODIES", "some")
    with pytest.raises(ConfigurationError, match="OPENHUB_REDACT_BODIES"):
        Settings.from_env()


def test_a_header_value_that_looks_like_a_credential_is_redacted_whatever_its_name() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"
    headers = [("X-Upstream", "Bearer abc.def"), ("X-Forward", "basic dXNlcjpwdw=="), ("X-Id-Token", jwt),
               ("X-Trace", f"id=1; t={jwt}"), ("X-Note", "Bearer"), ("Accept", "application/json"),
               ("X-Doc", "Basically fine")]
    assert redact_headers(headers) == {
        "X-Upstream": "[redacted]", "X-Forward": "[redacted]", "X-Id-Token": "[redacted]", "X-Trace": "[redacted]",
        "X-Note": "Bearer", "Accept": "application/json", "X-Doc": "Basically fine"}


def test_secret_named_fields_of_a_json_body_are_redacted_at_any_depth() -> None:
    body = json.dumps({"user": "ann", "password": "p4ss", "auth": {"user": "u", "key": "k"},
                       "lines": [{"sku": "s-1", "client_secret": "cs"}, 3, None], "Api-Key": 7}).encode()
    out = redact_body(body, "application/json; charset=utf-8")
    assert json.loads(out or b"") == {"user": "ann", "password": REDACTED, "auth": REDACTED,
                                      "lines": [{"sku": "s-1", "client_secret": REDACTED}, 3, None],
                                      "Api-Key": REDACTED}
    assert redact_body(json.dumps({"access_token": "t"}).encode(), "application/vnd.api+json") \
        == b'{"access_token": "[redacted]"}'
    # A body with nothing secret is recorded byte for byte, not re-encoded.
    plain = b'{ "sku" :"s-1",\n "qty": 2 }'
    assert redact_body(plain, "application/json") is plain


def test_secret_named_fields_of_a_form_body_are_redacted_and_the_rest_kept_as_sent() -> None:
    body = b"grant_type=client_credentials&client_secret=s%26x&scope=a+b&Password=p&flag&api%5Fkey=k"
    assert redact_body(body, "application/x-www-form-urlencoded") == \
        b"grant_type=client_credentials&client_secret=[redacted]&scope=a+b&Password=[redacted]&flag&api%5Fkey=[redacted]"


def test_unparseable_or_other_bodies_are_kept_and_redaction_never_raises() -> None:
    for body, content_type in ((b'{"password": "p', "application/json"), (b"\xff\xfe{", "application/json"),
                               (b"[" * 100_000, "application/json"), (b"password=p", "text/plain"),
                               (b"password=p", None), (b'{"password": "p"}', "application/octet-stream")):
        assert redact_body(body, content_type) == body
    form = b"\xff=\xfe&pass%FFword=x&password"  # `pass` is a word of the name: redacted all the same
    assert redact_body(form, "application/x-www-form-urlencoded") == b"\xff=\xfe&pass%FFword=[redacted]&password"
    assert redact_body(None, "application/json") is None and redact_body(b"", "application/json") == b""


def test_json_as_deep_as_the_parser_takes_is_still_redacted() -> None:
    depth = sys.getrecursionlimit() - 50  # parsed from a shallow stack; walked from wherever recording runs
    deep = b'{"a":' * depth + b'{"token": "t-1"}' + b"}" * depth
    out = redact_body(deep, "application/json") or b""
    assert b"t-1" not in out and out.count(b"[redacted]") == 1


def test_each_body_mode() -> None:
    body = b'{"password": "p", "sku": "s"}'
    assert redact_body(body, "application/json", "none") == body
    assert redact_body(body, "application/json", "fields") == b'{"password": "[redacted]", "sku": "s"}'
    assert redact_body(body, "application/json; charset=utf-8", "all") == \
        b"[application/json body of 29 bytes redacted]"
    assert redact_body(b"abc", None, "all") == b"[body of 3 bytes redacted]"
    assert redact_body(None, "application/json", "all") is None
