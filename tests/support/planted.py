"""Planted secrets: an external system that echoes them back, a receiver of confirmations, and the read-back
of every text the hub keeps or shows, as a source system and as the admin (tests/integration/
test_planted_secrets.py, bench/fuzz_api.py).

The secrets have shapes the redaction's shape test alone would not catch (lower-case hex, short words),
so each is found by what the hub knows of it: the name it was sent under, the place it was sent in (a URL's
userinfo, a webhook path), or the value the step sent (openhub.core.redact.remember, Route(secret_fields=)).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from email.message import Message
from typing import Any

import httpx

from tests.support.stubs import PostStub

# The names the planted secrets go under (tests/support/secret_routes.py uses each).
NAMES = (
    "userinfo",
    "bearer",
    "functions_key",
    "access_key",
    "pass_header",
    "hub_key",
    "subscription",
    "api_key",
    "query_pass",
    "query_pwd",
    "query_access",
    "query_private",
    "jwt",
    "fragment",
    "client_secret",
    "body_pwd",
    "body_pin",
    "private_key",
    "nested_password",
    "name_value",
    "path_token",
    "newline_token",
    "card_pin",
    "card_cvc",
    "receiver_token",
)


def plant() -> dict[str, str]:
    """A fresh secret per name: `<name><12 hex>` (no shape gives them away), the card's short."""
    out = {name: f"{name.replace('_', '')}{secrets.token_hex(6)}" for name in NAMES}
    # Short, as a PIN is, but not digits alone: a run of digits turns up in any log (pids, ports, times).
    out["card_pin"] = f"p{secrets.token_hex(3)}"
    out["card_cvc"] = f"c{secrets.token_hex(2)}"
    return out


class EchoSystem(PostStub):
    """An external system that answers every request with the request itself (method, URL, headers, body),
    as JSON: 500 on /fail the first time and 400 after, 409 on /conflict, 503 on /services/…, else 200."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        super().__init__("echo-system")

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        seen = {
            "method": "POST",
            "url": path,
            "headers": dict(headers.items()),
            "body": body.decode("utf-8", "replace"),
        }
        self.requests.append(seen)
        route = path.split("?", 1)[0]
        failed_before = sum(1 for r in self.requests if r["url"].startswith("/fail")) > 1
        status = (
            (400 if failed_before else 500)
            if route == "/fail"
            else 409
            if route == "/conflict"
            else 503
            if route.startswith("/services/")
            else 200
        )
        return status, "application/json", json.dumps({"error": "you sent", "request": seen}).encode()


class Receiver(PostStub):
    """Receives confirmations and alerts: keeps each POST's path, headers and body."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        super().__init__("receiver")

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        self.posts.append({"path": path, "headers": dict(headers.items()), "body": body.decode("utf-8", "replace")})
        return 200, None, b""


def submit_all(base: str, key: str, planted: dict[str, str], tag: str) -> dict[str, int]:
    """Submit one message to each route of tests/support/secret_routes.py; route -> message id."""
    ids = {}
    with httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {key}"}) as http:
        for route in ("fail", "conflict", "webhook", "newline", "card"):
            payload: dict[str, Any] = {"order": route}
            if route == "card":  # only its route marks the card's fields secret
                payload["card"] = {"pin": planted["card_pin"], "cvc": planted["card_cvc"], "holder": "Ann"}
            r = http.post(
                f"/api/v1/messages/secret/{route}", json=payload, headers={"X-Correlation-Id": f"{tag}-{route}"}
            )
            assert r.status_code == 202, r.text
            ids[route] = r.json()["id"]
    return ids


def read_back(base: str, key: str, admin: str, ids: Iterable[int]) -> dict[str, str]:
    """Every answer the API gives about the messages, as the source system and as the admin: where -> text."""
    texts: dict[str, str] = {}
    with httpx.Client(base_url=base, timeout=10) as http:
        for role, secret in (("source", key), ("admin", admin)):
            auth = {"Authorization": f"Bearer {secret}"}
            for message_id in ids:
                texts[f"{role} GET /messages/{message_id}"] = http.get(
                    f"/api/v1/messages/{message_id}", headers=auth
                ).text
            texts[f"{role} GET /messages"] = http.get("/api/v1/messages", params={"limit": 1000}, headers=auth).text
            texts[f"{role} GET /messages?state=FAILED"] = http.get(
                "/api/v1/messages", headers=auth, params={"state": "FAILED"}
            ).text
        auth = {"Authorization": f"Bearer {admin}"}
        for path in ("/api/v1/confirmations", "/api/v1/overview", "/api/v1/routes"):
            texts[f"admin GET {path}"] = http.get(path, headers=auth).text
    return texts


def leaks(texts: dict[str, str], planted: dict[str, str], allowed: dict[str, set[str]] | None = None) -> list[str]:
    """`where: name` for each planted secret found in a text (`allowed`: names a place may hold)."""
    found = []
    for where, text in texts.items():
        for name, value in planted.items():
            at = text.find(value)
            if at >= 0 and name not in (allowed or {}).get(where, set()):
                found.append(f"{where}: {name} in …{text[max(0, at - 160) : at + 40]!r}…")
    return found


def masked_payload(planted: dict[str, str]) -> dict[str, Any]:
    """The payload submit_all sends, as a reader sees it (the route marks the card's pin and cvc secret)."""
    return {"pin": "[redacted]", "cvc": "[redacted]", "holder": "Ann"}
