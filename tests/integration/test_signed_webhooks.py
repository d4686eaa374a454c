"""Signed webhooks (issue 27): under OPENHUB_WEBHOOK_SECRET every POST of the stock webhook carries the
Standard Webhooks headers, a receiver verifies them over the exact bytes it read (with
`openhub.outbound.notify.verify_signature` or the `standardwebhooks` package), and the secret never reaches a
stored error text or a log line."""

from __future__ import annotations

import base64
import logging
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import openhub
from openhub.core.errors import ConfigurationError, WebhookSignatureError
from openhub.outbound.notify import post_json, verify_signature, webhook
from openhub.testing import LocalHub
from tests.support import promise_routes as routes

KEY = b"the hub's first signing key"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
PLAIN = "a-plain-second-secret-of-32-chars-and-more"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A real HTTP receiver that keeps each POST's headers and raw body, answering `status`."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[Received] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.posts.append(Received(dict(self.headers.items()), body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks-{uuid.uuid4().hex[:6]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _fail_one_message(receiver: Receiver, **settings: str) -> LocalHub:
    """A hub with the stock webhook on `receiver`, a message FAILED and its notification sent."""
    routes.reset()
    hub = LocalHub(
        "tests.support.promise_routes",
        source_system="CONFIRMED",
        OPENHUB_WEBHOOK_URL=receiver.url,
        OPENHUB_WEBHOOK_STATES="FAILED",
        **settings,
    )
    with hub:
        view = hub.submit("p.reserve", {"raise": "out_of_stock"})
        hub.run()
        hub.tick()
        assert hub.get(view.id).state == "FAILED"
    routes.reset()
    return hub


def test_a_signed_webhook_verifies_over_the_body_received_and_a_tampered_one_does_not(receiver: Receiver) -> None:
    _fail_one_message(receiver, OPENHUB_WEBHOOK_SECRET=SECRET)
    (post,) = receiver.posts
    headers = {k.lower(): v for k, v in post.headers.items()}
    assert headers["webhook-id"] == headers["idempotency-key"]
    assert headers["content-type"] == "application/json"
    assert headers["webhook-signature"].startswith("v1,") and " " not in headers["webhook-signature"]
    verify_signature(SECRET, post.headers, post.body)
    assert Webhook(SECRET).verify(post.body, post.headers)["state"] == "FAILED"  # the reference library agrees

    tampered = post.body.replace(b'"FAILED"', b'"OK"')
    assert tampered != post.body
    with pytest.raises(WebhookSignatureError, match="no webhook signature matches"):
        verify_signature(SECRET, post.headers, tampered)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, post.headers)
    with pytest.raises(WebhookSignatureError, match="no webhook signature matches"):
        verify_signature("whsec_" + base64.b64encode(b"another key").decode(), post.headers, post.body)


def test_two_secrets_give_two_signatures_and_either_verifies(receiver: Receiver) -> None:
    _fail_one_message(receiver, OPENHUB_WEBHOOK_SECRET=f"{SECRET} {PLAIN}")
    (post,) = receiver.posts
    assert len(post.headers["webhook-signature"].split(" ")) == 2
    verify_signature(SECRET, post.headers, post.body)  # a receiver still on the old secret
    verify_signature(PLAIN, post.headers, post.body)  # one already on the new one
    Webhook(SECRET).verify(post.body, post.headers)
    Webhook(PLAIN.encode()).verify(post.body, post.headers)  # a plain secret's key is its UTF-8 bytes
    with pytest.raises(WebhookSignatureError):
        verify_signature("a-third-secret-also-32-characters-long", post.headers, post.body)


def test_without_a_secret_no_signature_headers_are_sent(receiver: Receiver) -> None:
    _fail_one_message(receiver)
    (post,) = receiver.posts
    names = {k.lower() for k in post.headers}
    assert "idempotency-key" in names and not {"webhook-id", "webhook-timestamp", "webhook-signature"} & names
    with pytest.raises(WebhookSignatureError, match="not signed"):
        verify_signature(SECRET, post.headers, post.body)


def test_a_retry_keeps_its_webhook_id_and_is_signed_anew(receiver: Receiver) -> None:
    receiver.status = 503
    routes.reset()
    with LocalHub(
        "tests.support.promise_routes",
        source_system="CONFIRMED",
        OPENHUB_WEBHOOK_URL=receiver.url,
        OPENHUB_WEBHOOK_SECRET=SECRET,
    ) as hub:
        hub.submit("p.reserve", {"raise": "out_of_stock"})
        hub.run()
        hub.tick()
        receiver.status = 200
        hub.tick(seconds=120)
    routes.reset()
    first, second = receiver.posts
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    verify_signature(SECRET, first.headers, first.body)
    verify_signature(SECRET, second.headers, second.body)


def test_the_secret_is_in_no_stored_error_or_log_when_the_receiver_fails(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.status = 500
    caplog.set_level(logging.DEBUG)
    routes.reset()
    with LocalHub(
        "tests.support.promise_routes",
        source_system="CONFIRMED",
        OPENHUB_WEBHOOK_URL=receiver.url,
        OPENHUB_WEBHOOK_SECRET=f"{SECRET} {PLAIN}",
        OPENHUB_CONFIRM_MAX_FAILS="2",
    ) as hub:
        hub.submit("p.reserve", {"raise": "out_of_stock"})
        hub.run()
        hub.tick()
        hub.tick(seconds=120)
        (parked,) = [r for r in openhub.list_confirmations(state="FAILED_END") if r["hook"] == "webhook"]
    routes.reset()
    assert len(receiver.posts) == 2 and "500" in parked["last_error"]
    signatures = [s for post in receiver.posts for s in post.headers["webhook-signature"].split(" ")]
    for secret in (SECRET, SECRET.removeprefix("whsec_"), PLAIN, KEY.decode(), *signatures):
        assert secret not in parked["last_error"]
        assert secret not in caplog.text


def test_post_json_without_a_secret_signs_with_the_given_hubs_operator_secret(receiver: Receiver) -> None:
    """`post_json` reads no process settings: without `secret` it signs with the OPENHUB_WEBHOOK_SECRET of the
    settings its caller hands it (a confirmer's `outcome.settings`), and with neither it refuses to guess."""
    from openhub.core.config import Settings

    post_json(receiver.url, 5.0, {"id": 1}, "evt-3", settings=Settings.from_env({"OPENHUB_WEBHOOK_SECRET": SECRET}))
    verify_signature(SECRET, receiver.posts[0].headers, receiver.posts[0].body)
    with pytest.raises(TypeError, match="secret"):
        post_json(receiver.url, 5.0, {"id": 1}, "evt-4")
    assert len(receiver.posts) == 1


def test_a_hooks_own_secret_overrides_the_setting_and_an_empty_one_sends_unsigned(receiver: Receiver) -> None:
    post_json(receiver.url, 5.0, {"id": 1, "state": "OK"}, "evt-1", secret=PLAIN)  # a confirmer's own POST
    post_json(receiver.url, 5.0, {"id": 1, "state": "OK"}, "evt-2", secret="")
    signed, unsigned = receiver.posts
    verify_signature(PLAIN, signed.headers, signed.body)
    assert signed.headers["Idempotency-Key"] == signed.headers["webhook-id"] == "evt-1"
    assert "webhook-signature" not in {k.lower() for k in unsigned.headers}
    with pytest.raises(ConfigurationError, match="not base64") as raised:
        webhook(f"{receiver.url}?token=t0ken", secret="whsec_not*base64!")  # refused when declared
    assert "not*base64" not in str(raised.value) and "t0ken" not in str(raised.value)


def _key(n: int) -> str:
    return "whsec_" + base64.b64encode(bytes([n]) * 32).decode()


OPERATORS, CONFIRMED, SHOP = _key(1), _key(2), _key(3)


def _signed_with(post: Received, secret: str) -> bool:
    try:
        verify_signature(secret, post.headers, post.body)
    except WebhookSignatureError:
        return False
    return True


def test_a_confirmation_is_signed_with_its_source_systems_secret_never_the_operators(
    receiver: Receiver, local_store_env: dict[str, str]
) -> None:
    """Issue 34 M6: with `confirmation("CRM")(webhook(url))` every confirmation was signed with the one
    OPENHUB_WEBHOOK_SECRET, so CRM, holding it to verify its own, could forge SHOP's and the operators'
    alerts; and webhook-id was `openhub:<id>:<state>:<n>`, n a global counter anyone could guess."""
    with routes.local_hub(
        **local_store_env,
        OPENHUB_WEBHOOK_URL=receiver.url,
        OPENHUB_WEBHOOK_STATES="FAILED",
        OPENHUB_WEBHOOK_SECRET=OPERATORS,
        OPENHUB_CONFIRM_SECRETS=f"CONFIRMED={CONFIRMED},SHOP={SHOP}",
    ) as hub:
        routes.HOOKS["confirm"] = webhook(receiver.url)  # CONFIRMED's confirmer: the stock webhook
        failed = [hub.submit("p.reserve", {"raise": "out_of_stock"}).id for _ in range(2)]
        hub.run()
        hub.tick()
        assert {hub.get(i).state for i in failed} == {"FAILED"}
        rows = openhub.list_confirmations(limit=10)
    routes.reset()
    assert {r["state"] for r in rows} == {"OK"}, rows  # the stock webhook, the routes' own hook, the confirmation
    by_id = {p.headers["webhook-id"]: p for p in receiver.posts}
    assert len(receiver.posts) == len(by_id) == 4  # one id per notification
    hooks = [p for p in receiver.posts if _signed_with(p, OPERATORS)]
    confirmations = [p for p in receiver.posts if _signed_with(p, CONFIRMED)]
    assert len(hooks) == len(confirmations) == 2 and not set(map(id, hooks)) & set(map(id, confirmations))
    assert not any(_signed_with(p, SHOP) for p in receiver.posts)
    for post in receiver.posts:  # unguessable: neither the message id nor a counter, 24 random characters
        webhook_id = post.headers["webhook-id"]
        assert webhook_id == post.headers["Idempotency-Key"]
        assert webhook_id.startswith("openhub_") and len(webhook_id) == len("openhub_") + 24, webhook_id
        assert not any(f"{i}" == part for i in failed for part in webhook_id.split(":"))


def test_a_source_system_without_its_own_secret_is_not_signed_with_the_operators(
    receiver: Receiver, local_store_env: dict[str, str]
) -> None:
    with routes.local_hub(
        **local_store_env, OPENHUB_WEBHOOK_SECRET=OPERATORS, OPENHUB_CONFIRM_SECRETS=f"SHOP={SHOP}"
    ) as hub:
        routes.HOOKS["confirm"] = webhook(receiver.url)
        hub.submit("p.reserve", {"raise": "out_of_stock"})
        hub.run()
        hub.tick()
        (row,) = [r for r in openhub.list_confirmations(limit=10) if r["hook"] is None]
    routes.reset()
    assert receiver.posts == [] and row["state"] == "FAILED"
    assert "no OPENHUB_CONFIRM_SECRETS secret for source system CONFIRMED" in row["last_error"]


def test_a_replayed_request_is_refused(receiver: Receiver) -> None:
    """Issue 34 L3 (the hub's retries, signed anew at a later second, pass: tests/unit/test_signing.py)."""
    from openhub.outbound.notify import ReplayCache

    _fail_one_message(receiver, OPENHUB_WEBHOOK_SECRET=SECRET)
    (post,) = receiver.posts
    replays = ReplayCache()
    verify_signature(SECRET, post.headers, post.body, replays=replays)
    with pytest.raises(WebhookSignatureError, match="a replay"):
        verify_signature(SECRET, post.headers, post.body, replays=replays)
