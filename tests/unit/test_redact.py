"""The one place secrets are redacted: URLs' userinfo and secret-named query values, headers, bodies."""

from __future__ import annotations

import json
import sys

import pytest

from openhub.core.config import Settings
from openhub.core.errors import ConfigurationError
from openhub.core.redact import REDACTED, redact_body, redact_headers, redact_text, redact_url


def test_userinfo_and_secret_query_values_are_redacted() -> None:
    url = "https://svc:hunter2@billing.example/customers?api_key=k-123&page=2&token=t&Signature=s"
    assert redact_url(url) == "https://***@billing.example/customers?api_key=***&page=2&token=***&Signature=***"
    assert redact_url(redact_url(url)) == redact_url(url)


def test_a_url_without_secrets_is_unchanged() -> None:
    for url in ("https://billing.example/customers?page=2&sort=name", "http://127.0.0.1:8765/b", "http://h/p?a=%20b"):
        assert redact_url(url) == url


def test_every_url_in_an_error_text_is_redacted() -> None:
    text = (
        "Traceback (most recent call last):\n  ...\nhttpx.HTTPStatusError: Server error '503 Service Unavailable' "
        "for url 'http://u:p@crm.example/hook?token=abc'\nFor more information check: https://developer.mozilla.org/x"
    )
    out = redact_text(text)
    assert "u:p" not in out and "abc" not in out
    assert "for url 'http://***@crm.example/hook?token=***'" in out
    assert redact_text(out) == out
    assert "https://developer.mozilla.org/x" in out
    assert redact_text(None) is None and redact_text("no url here") == "no url here"


def test_configured_header_names_are_redacted_on_top_of_the_built_in_ones() -> None:
    headers = [("X-Vendor-Ref", "v-1"), ("x-tenant", "t-1"), ("Authorization", "x"), ("Accept", "json")]
    assert redact_headers(headers, names=["x-vendor-ref", "X-TENANT"]) == {
        "X-Vendor-Ref": "[redacted]",
        "x-tenant": "[redacted]",
        "Authorization": "[redacted]",
        "Accept": "json",
    }
    # The configured list only adds: the built-in names stay redacted whatever it holds.
    assert redact_headers([("Authorization", "x"), ("X-Vendor-Ref", "v-1")], names=[]) == {
        "Authorization": "[redacted]",
        "X-Vendor-Ref": "v-1",
    }


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
    headers = [
        ("X-Upstream", "Bearer abc.def"),
        ("X-Forward", "basic dXNlcjpwdw=="),
        ("X-Id-Token", jwt),
        ("X-Trace", f"id=1; t={jwt}"),
        ("X-Note", "Bearer"),
        ("Accept", "application/json"),
        ("X-Doc", "Basically fine"),
    ]
    assert redact_headers(headers) == {
        "X-Upstream": "[redacted]",
        "X-Forward": "[redacted]",
        "X-Id-Token": "[redacted]",
        "X-Trace": "[redacted]",
        "X-Note": "Bearer",
        "Accept": "application/json",
        "X-Doc": "Basically fine",
    }


def test_secret_named_fields_of_a_json_body_are_redacted_at_any_depth() -> None:
    body = json.dumps(
        {
            "user": "ann",
            "password": "p4ss",
            "auth": {"user": "u", "key": "k"},
            "lines": [{"sku": "s-1", "client_secret": "cs"}, 3, None],
            "Api-Key": 7,
        }
    ).encode()
    out = redact_body(body, "application/json; charset=utf-8")
    assert json.loads(out or b"") == {
        "user": "ann",
        "password": REDACTED,
        "auth": REDACTED,
        "lines": [{"sku": "s-1", "client_secret": REDACTED}, 3, None],
        "Api-Key": REDACTED,
    }
    assert (
        redact_body(json.dumps({"access_token": "t"}).encode(), "application/vnd.api+json")
        == b'{"access_token": "[redacted]"}'
    )
    # A body with nothing secret is recorded byte for byte, not re-encoded.
    plain = b'{ "sku" :"s-1",\n "qty": 2 }'
    assert redact_body(plain, "application/json") is plain


def test_secret_named_fields_of_a_form_body_are_redacted_and_the_rest_kept_as_sent() -> None:
    body = b"grant_type=client_credentials&client_secret=s%26x&scope=a+b&Password=p&flag&api%5Fkey=k"
    assert (
        redact_body(body, "application/x-www-form-urlencoded")
        == b"grant_type=client_credentials&client_secret=[redacted]&scope=a+b&Password=[redacted]&flag"
        b"&api%5Fkey=[redacted]"
    )


def test_unparseable_or_other_bodies_are_kept_and_redaction_never_raises() -> None:
    for body, content_type in (
        (b'{"password": "p', "application/json"),
        (b"\xff\xfe{", "application/json"),
        (b"[" * 100_000, "application/json"),
        (b"password=p", "text/plain"),
        (b"password=p", None),
        (b'{"password": "p"}', "application/octet-stream"),
    ):
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
    assert (
        redact_body(body, "application/json; charset=utf-8", "all") == b"[application/json body of 29 bytes redacted]"
    )
    assert redact_body(b"abc", None, "all") == b"[body of 3 bytes redacted]"
    assert redact_body(None, "application/json", "all") is None


# --- issue 34 M1: the names and places the lists missed, and the one text pass -----------------------------


def test_the_names_the_lists_missed_in_urls_are_redacted() -> None:
    url = "https://api.example/v1/x?pass=p1&pwd=p2&access_key=a3&private_key=k4&jwt=j5&page=2#access_token=t6&state=s"
    assert redact_url(url) == (
        "https://api.example/v1/x?pass=***&pwd=***&access_key=***&private_key=***&jwt=***"
        "&page=2#access_token=***&state=s"
    )
    assert redact_url("https://app.example/cb?code=oauth-7&state=xyz") == "https://app.example/cb?code=***&state=xyz"


@pytest.mark.parametrize(
    "url, kept",
    [
        (
            "https://hooks.slack.com/services/T0AAA1111/B0BBB2222/abcdEFGH1234ijklMNOP5678",
            "https://hooks.slack.com/services/",
        ),
        (
            "https://contoso.webhook.office.com/webhookb2/1a2b@3c4d/IncomingWebhook/5e6f/7a8b",
            "https://contoso.webhook.office.com/webhookb2/",
        ),
        ("https://discord.com/api/webhooks/123456/tok-en_value", "https://discord.com/api/webhooks/"),
        (
            "https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage",
            "https://api.telegram.org/bot",
        ),
        ("https://files.example/d/Zq8xK2mP9vL4nR7tW1yB3cF6hJ0sD5gA/report.pdf", "https://files.example/d/"),
    ],
)
def test_a_secret_in_a_url_path_is_redacted(url: str, kept: str) -> None:
    out = redact_url(url)
    assert out.startswith(kept) and "***" in out and redact_url(out) == out
    secret = url.removeprefix(kept).split("/")[0 if "files" not in url else 0]
    assert secret not in out


def test_the_header_names_the_lists_missed_are_redacted_and_other_values_pass_the_text_pass() -> None:
    headers = [
        ("X-Functions-Key", "fk-1"),
        ("X-Access-Key", "ak-2"),
        ("X-Pass", "pw-3"),
        ("X-Hub-Key", "hk-4"),
        ("Location", "https://app.example/cb?code=oauth-5"),
        ("Idempotency-Key", "CRM/c-1/step"),
        ("X-Correlation-Id", "c-1"),
        ("Content-Type", "application/json"),
    ]
    assert redact_headers(headers) == {
        "X-Functions-Key": REDACTED,
        "X-Access-Key": REDACTED,
        "X-Pass": REDACTED,
        "X-Hub-Key": REDACTED,
        "Location": "https://app.example/cb?code=***",
        "Idempotency-Key": "CRM/c-1/step",
        "X-Correlation-Id": "c-1",
        "Content-Type": "application/json",
    }


def test_the_body_fields_the_lists_missed_and_name_value_pairs_are_redacted() -> None:
    body = json.dumps(
        {
            "pwd": "a",
            "pin": "1234",
            "privateKey": "k",
            "user": "ann",
            "fields": [{"name": "password", "value": "p"}, {"name": "email", "value": "e"}],
        }
    ).encode()
    assert json.loads(redact_body(body, "application/json") or b"") == {
        "pwd": REDACTED,
        "pin": REDACTED,
        "privateKey": REDACTED,
        "user": "ann",
        "fields": [{"name": "password", "value": REDACTED}, {"name": "email", "value": "e"}],
    }


@pytest.mark.parametrize(
    "text, secret",
    [
        (
            'POST https://billing.example/x answered 400: {"client_secret": "cs-1", "nested": {"password": "pw-2"}}',
            "cs-1",
        ),
        ('... answered 400: {"client_secret": "cs-1", "nested": {"password": "pw-2"}}', "pw-2"),
        ("httpx.LocalProtocolError: Illegal header value b'Bearer tok3nV4lue-abc\\n'", "tok3nV4lue-abc"),
        ("KeyError: {'pwd': 'pw-4', 'sku': 's-1'}", "pw-4"),
        ('[{"name": "password", "value": "pw-5"}]', "pw-5"),
        ("X-Functions-Key: fk-6\nX-Pass: pw-7", "fk-6"),
        ("X-Functions-Key: fk-6\nX-Pass: pw-7", "pw-7"),
        ("login failed: password=pw-8 for ann", "pw-8"),
        ("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "eyJhbGciOiJIUzI1NiJ9"),
        ("key Zq8xK2mP9vL4nR7tW1yB3cF6hJ0sD5gA in the text", "Zq8xK2mP9vL4nR7tW1yB3cF6hJ0sD5gA"),
        ("stripe sk_live_51Habcdef0123 and github ghp_abcdefghijklmnopqrstuvwx12", "sk_live_51Habcdef0123"),
        ('{"password": "cut off before it clos', "cut off before"),
    ],
)
def test_the_text_pass_redacts_secrets_in_errors_bodies_and_tracebacks(text: str, secret: str) -> None:
    out = redact_text(text) or ""
    assert secret not in out and REDACTED in out or "***" in out, out
    assert redact_text(out) == out


def test_the_text_pass_keeps_what_is_not_secret() -> None:
    for text in (
        "error_code=HTTP_503 for message 12",
        "trace 4bf92f3577b34da6a3ce929d0e0e4736",
        "uuid 550e8400-e29b-41d4-a716-446655440000",
        "Idempotency-Key: CRM/order-4711/update_billing",
        'KeyError: "externalCustomerId"',
        "a test_an_error_before_any_call_does_not_count name",
        '{"code": "E409", "text": "customer exists"}',
        "Bearer",
    ):
        assert redact_text(text) == text


def test_the_values_a_step_sent_as_secrets_are_redacted_whatever_their_shape() -> None:
    from openhub.core.redact import remember, secrets_scope

    echo = "upstream said: you sent opaque-1 and 'Bearer zz' with pin 4711"
    with secrets_scope(["4711"]):
        remember("Bearer opaque-1", "zz")  # too short to be known: redacted by nothing but its name
        out = redact_text(echo) or ""
    assert "opaque-1" not in out and "4711" not in out and "zz" in out
    assert redact_text(echo) == echo  # outside the scope nothing is known
    remember("opaque-1")  # outside any scope: noted nowhere
    assert redact_text(echo) == echo


def test_configured_names_add_to_the_built_in_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from openhub.core.config import get_settings, reset_settings
    from openhub.core.redact import is_secret_name

    assert not is_secret_name("X-Vendor-Ref")
    monkeypatch.setenv("OPENHUB_REDACT_NAMES", "X-Vendor-Ref, tenant_code")
    reset_settings()
    try:
        get_settings()  # a driver reads the process's settings: their names are handed to the redaction
        assert is_secret_name("x-vendor-ref") and is_secret_name("TENANT_CODE") and is_secret_name("password")
        assert (
            redact_text("X-Vendor-Ref: v-1 and tenant_code=t-2")
            == "X-Vendor-Ref: [redacted] and tenant_code=[redacted]"
        )
    finally:
        monkeypatch.delenv("OPENHUB_REDACT_NAMES")
        reset_settings()
        get_settings()
    assert not is_secret_name("x-vendor-ref")


def test_the_process_redacts_by_the_names_of_the_settings_it_serves() -> None:
    """No module below the drivers reads the process's settings for its names (tests/unit/test_layers.py):
    openhub.core.config hands them to the redaction wherever the process's settings change, a hub
    installed (`serve_settings`), its settings changed live (`swap_settings`), the hub closed."""
    import dataclasses

    from openhub.core.config import Settings, serve_settings, swap_settings
    from openhub.core.redact import is_secret_name

    installed = Settings.from_env({"OPENHUB_REDACT_NAMES": "x-tenant"})
    assert not is_secret_name("X-Tenant")
    serve_settings(installed)
    try:
        assert is_secret_name("X-Tenant") and redact_text("X-Tenant: t-1") == "X-Tenant: [redacted]"
        changed = dataclasses.replace(installed, redact_names=frozenset({"x-other"}))
        swap_settings(installed, changed)
        assert is_secret_name("X-Other") and not is_secret_name("X-Tenant")
        swap_settings(Settings.from_env({}), Settings.from_env({"OPENHUB_REDACT_NAMES": "x-third"}))  # not served
        assert not is_secret_name("X-Third")
    finally:
        serve_settings(None)
    assert not is_secret_name("X-Other")


def test_a_route_marks_payload_fields_secret() -> None:
    from openhub.core.secret_fields import mask_fields, secret_values

    payload = {"card": {"pin": "4711", "holder": "Ann"}, "lines": [{"pin": "1"}, {"pin": "2"}], "n": 3}
    assert secret_values(payload, ["card.pin", "lines.pin", "missing.x"]) == ["4711", "1", "2"]
    assert mask_fields(payload, ["card.pin", "lines.pin"]) == {
        "card": {"pin": REDACTED, "holder": "Ann"},
        "lines": [{"pin": REDACTED}, {"pin": REDACTED}],
        "n": 3,
    }
    assert payload["card"]["pin"] == "4711"  # the stored payload is the steps'


def test_a_text_the_pass_cannot_read_is_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    from openhub.core import redact

    def broken(text: str) -> str:
        raise RuntimeError("bug")

    monkeypatch.setattr(redact, "_redact", broken)
    assert redact_text("password=p") == "[redaction failed: 10 characters withheld]"
