"""Issue 36: operator roles and the audit trail, over the app's own OpenAPI document.

Every mutating endpoint is enumerated from the OpenAPI document, so a new endpoint that forgets its
role, or its audit entry, fails here: a viewer gets 403 on each one, an operator on the admin's (tokens,
configuration), a source system's key on every one but its own (submit, batch, response); each call by an
operator's token leaves exactly one audit entry naming the token.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Callable

import pytest
from sqlalchemy import func, select, update

from openhub.core.config import get_settings
from openhub.store import audit, tokens
from openhub.store.schema import audit as audit_table
from openhub.store.schema import confirmations, messages, route_pauses, workers
from tests.integration.api.conftest import ADMIN, CRM, bearer
from tests.support.process_store import store_now, transaction

MUTATING = {"post", "put", "delete", "patch"}
# The ingresses a source system's key may use (the SOAP one answers a source key with its own faults).
SOURCE_ENDPOINTS = {
    ("post", "/api/v1/messages/{service}/{operation}"),
    ("post", "/api/v1/messages:batch"),
    ("post", "/api/v1/messages/{message_id}:response"),
    ("post", "/api/v1/messages/{message_id}/response"),
    ("post", "/soap/{service}"),
}
ADMIN_ONLY = re.compile(r"^/api/v1/(tokens|config)\b")


@pytest.fixture
def role_tokens(api_env) -> dict[str, dict[str, str]]:
    """A named token of each role (unique names: the store outlives the test)."""
    suffix = uuid.uuid4().hex[:8]
    made = {}
    for role in audit.ROLES:
        name = f"{role}-{suffix}"
        made[role] = {"name": name, "headers": bearer(tokens.add(name, role, url=get_settings().database_url))}
    return made


def mutating_endpoints(client) -> list[tuple[str, str]]:
    schema = client.get("/openapi.json").json()
    return sorted((method, path) for path, item in schema["paths"].items() for method in item if method in MUTATING)


def concrete(path: str, message_id: int = 1) -> str:
    return (
        path.replace("{message_id}", str(message_id))
        .replace("{service}", "api")
        .replace("{operation}", "validated")
        .replace("{confirmation_id}", "1")
        .replace("{name}", "nobody")
        .replace("{system}", "test-billing")
        .replace("{worker_id}", "no-such-worker")
        .replace("{host}", "no-such-host")
    )


def test_a_viewer_is_refused_every_mutating_endpoint(client, role_tokens):
    viewer = role_tokens["viewer"]["headers"]
    endpoints = mutating_endpoints(client)
    assert ("post", "/api/v1/messages/{message_id}:restart") in endpoints and ("post", "/api/v1/tokens") in endpoints
    for method, path in endpoints:
        r = client.request(method.upper(), concrete(path), headers={**viewer, "X-Correlation-Id": "c"}, json={})
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    assert client.get("/api/v1/messages", headers=viewer).status_code == 200  # reads everything
    assert client.get("/api/v1/audit", headers=viewer).status_code == 200
    assert client.get("/api/v1/whoami", headers=viewer).json() == {
        "name": role_tokens["viewer"]["name"],
        "role": "viewer",
        "source_system": None,
    }


def test_an_operator_is_refused_tokens_and_configuration_and_a_source_key_every_operator_endpoint(client, role_tokens):
    operator = role_tokens["operator"]["headers"]
    for method, path in mutating_endpoints(client):
        body = client.request(method.upper(), concrete(path), headers={**CRM, "X-Correlation-Id": "c"}, json={})
        if (method, path) not in SOURCE_ENDPOINTS:
            assert body.status_code == 403, (method, path, body.status_code, body.text)
        if ADMIN_ONLY.match(path):
            r = client.request(method.upper(), concrete(path), headers=operator, json={})
            assert r.status_code == 403 and "needs the role admin" in r.json()["detail"], (method, path, r.text)
    assert client.get("/api/v1/tokens", headers=operator).status_code == 403
    assert client.get("/api/v1/tokens", headers=role_tokens["admin"]["headers"]).status_code == 200


def test_a_revoked_token_is_refused_and_tokens_are_kept_hashed(client, role_tokens):
    admin = role_tokens["admin"]["headers"]
    made = client.post("/api/v1/tokens", json={"name": f"t-{uuid.uuid4().hex[:8]}", "role": "viewer"}, headers=admin)
    assert made.status_code == 201, made.text
    secret, name = made.json()["token"], made.json()["name"]
    assert client.get("/api/v1/overview", headers=bearer(secret)).status_code == 200
    listed = client.get("/api/v1/tokens", headers=admin).text
    assert name in listed and secret not in listed and tokens.digest(secret) not in listed
    assert client.delete(f"/api/v1/tokens/{name}", headers=admin).status_code == 200
    assert client.get("/api/v1/overview", headers=bearer(secret)).status_code == 401
    assert client.post("/api/v1/tokens", json={"name": name, "role": "viewer"}, headers=admin).status_code == 409
    assert client.post("/api/v1/tokens", json={"name": "x y", "role": "viewer"}, headers=admin).status_code == 400
    assert client.post("/api/v1/tokens", json={"name": "ok", "role": "root"}, headers=admin).status_code == 400


def _entries(name: str) -> list[dict[str, Any]]:
    return audit.entries(who=name, limit=1000, url=get_settings().database_url)


def _submit(client, cid: str) -> int:
    r = client.post("/api/v1/messages/api/validated", json={"ok": 1}, headers={**CRM, "X-Correlation-Id": cid})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _parked_confirmation(message_id: int) -> int:
    now = store_now()
    with transaction() as conn:
        return conn.execute(
            confirmations.insert().values(
                message_id=message_id, outcome="OK", state="FAILED_END", attempts=5, created_at=now, updated_at=now
            )
        ).inserted_primary_key[0]


def test_every_mutating_call_leaves_exactly_one_audit_entry_naming_its_token(client, role_tokens, cid):
    """No worker runs here: a submitted message stays NEW, so it can be cancelled, then restarted."""
    operator, admin = role_tokens["operator"], role_tokens["admin"]
    m = _submit(client, cid)
    m2 = _submit(client, cid + "-2")
    m3, m4 = _submit(client, cid + "-3"), _submit(client, cid + "-4")
    with transaction() as conn:  # no worker: a retry's and a failure's state are written here
        conn.execute(update(messages).where(messages.c.id == m3).values(state="POSTPONED", due_at=None))
        conn.execute(update(messages).where(messages.c.id == m4).values(state="FAILED", due_at=None))
    made = f"made-{uuid.uuid4().hex[:8]}"
    worker_id, host = str(uuid.uuid4()), f"host-{uuid.uuid4().hex[:8]}"
    with transaction() as conn:  # a worker's main process, as its heartbeat writes it (no worker runs here)
        now = store_now()
        conn.execute(workers.insert().values(id=worker_id, node=f"{host}:1", up_since=now, last_seen=now, taking=True))
    calls: dict[tuple[str, str], tuple[dict[str, Any], Callable[[], Any]]] = {
        ("post", "/api/v1/messages/{message_id}:cancel"): (operator, lambda: f"/api/v1/messages/{m}:cancel"),
        ("post", "/api/v1/messages/{message_id}:restart"): (operator, lambda: f"/api/v1/messages/{m}:restart"),
        ("post", "/api/v1/messages/{message_id}/cancel"): (operator, lambda: f"/api/v1/messages/{m}/cancel"),
        ("post", "/api/v1/messages/{message_id}/restart"): (operator, lambda: f"/api/v1/messages/{m}/restart"),
        ("post", "/api/v1/messages:cancel"): (operator, lambda: ("/api/v1/messages:cancel", {"correlation_id": cid})),
        ("post", "/api/v1/messages:restart"): (operator, lambda: ("/api/v1/messages:restart", {"correlation_id": cid})),
        ("post", "/api/v1/messages/{message_id}:retry"): (operator, lambda: f"/api/v1/messages/{m3}:retry"),
        ("post", "/api/v1/messages/{message_id}:resubmit"): (
            operator,
            lambda: (f"/api/v1/messages/{m4}:resubmit", {"payload": {"ok": 2}}),
        ),
        ("post", "/api/v1/messages/{message_id}:response"): (
            operator,
            lambda: (f"/api/v1/messages/{m2}:response?token=nope", {}),
        ),
        ("post", "/api/v1/messages/{message_id}/response"): (
            operator,
            lambda: (f"/api/v1/messages/{m2}/response?token=nope", {}),
        ),
        ("post", "/api/v1/routes/{service}/{operation}/pause"): (
            operator,
            lambda: "/api/v1/routes/api/validated/pause",
        ),
        ("post", "/api/v1/routes/{service}/{operation}/resume"): (
            operator,
            lambda: "/api/v1/routes/api/validated/resume",
        ),
        ("put", "/api/v1/drain"): (operator, lambda: "/api/v1/drain"),
        ("delete", "/api/v1/drain"): (operator, lambda: "/api/v1/drain"),
        ("post", "/api/v1/confirmations/{confirmation_id}/resend"): (
            operator,
            lambda: f"/api/v1/confirmations/{_parked_confirmation(m2)}/resend",
        ),
        ("post", "/api/v1/confirmations:resend"): (operator, lambda: ("/api/v1/confirmations:resend", {})),
        ("post", "/api/v1/breakers/{system}:open"): (
            operator,
            lambda: ("/api/v1/breakers/test-billing:open", {"reason": "maintenance", "seconds": 5}),
        ),
        ("post", "/api/v1/breakers/{system}:reset"): (
            operator,
            lambda: ("/api/v1/breakers/test-billing:reset", {"reason": "back"}),
        ),
        ("post", "/api/v1/workers/{worker_id}:finish"): (
            operator,
            lambda: (f"/api/v1/workers/{worker_id}:finish", {"reason": "host patch"}),
        ),
        ("post", "/api/v1/workers/{worker_id}:resume"): (operator, lambda: f"/api/v1/workers/{worker_id}:resume"),
        ("post", "/api/v1/hosts/{host}:finish"): (operator, lambda: (f"/api/v1/hosts/{host}:finish", {})),
        ("post", "/api/v1/hosts/{host}:resume"): (operator, lambda: f"/api/v1/hosts/{host}:resume"),
        ("post", "/api/v1/tokens"): (admin, lambda: ("/api/v1/tokens", {"name": made, "role": "viewer"})),
        ("delete", "/api/v1/tokens/{name}"): (admin, lambda: f"/api/v1/tokens/{made}"),
        ("put", "/api/v1/config/{name}"): (admin, lambda: ("/api/v1/config/OPENHUB_MAX_FAILS", {"value": "4"})),
        ("delete", "/api/v1/config/{name}"): (admin, lambda: "/api/v1/config/OPENHUB_MAX_FAILS"),
    }
    operator_endpoints = [e for e in mutating_endpoints(client) if e not in SOURCE_ENDPOINTS] + [
        e for e in SOURCE_ENDPOINTS if "response" in e[1]
    ]
    assert sorted(calls) == sorted(operator_endpoints), "a mutating endpoint without an audit scenario here"
    for (method, template), (token, target) in calls.items():
        before = len(_entries(token["name"]))
        made_target = target()
        path, body = made_target if isinstance(made_target, tuple) else (made_target, None)
        r = client.request(method.upper(), path, headers=token["headers"], json=body)
        assert r.status_code < 500, (template, r.status_code, r.text)
        after = _entries(token["name"])
        assert len(after) == before + 1, (method, template, r.status_code, r.text, after[:2])
        assert after[0]["who"] == token["name"] and after[0]["request_id"] and after[0]["client"]
    actions = {e["action"] for e in _entries(operator["name"])}
    assert {
        "message.cancel",
        "message.restart",
        "message.restart_matching",
        "message.cancel_matching",
        "route.pause",
        "route.resume",
        "hub.drain",
        "hub.undrain",
        "confirmation.resend",
        "confirmation.resend_parked",
        "message.respond",
        "message.retry_now",
        "message.edit_payload",
        "breaker.open",
        "breaker.reset",
        "worker.finish",
        "worker.resume",
    } <= actions
    # The message's history names the operator's actions; a source system's view does not.
    detail = client.get(f"/api/v1/messages/{m}", headers=ADMIN).json()
    assert [e["action"] for e in detail["operator_actions"]][:2] == ["message.cancel", "message.restart"]
    assert any(h["detail"] == f"restarted by {operator['name']}" for h in detail["history"])
    assert "operator_actions" not in client.get(f"/api/v1/messages/{m}", headers=CRM).json()
    # Filters: who, action, time; the trail has no endpoint that changes it.
    only = client.get("/api/v1/audit", params={"who": operator["name"], "action": "hub.drain"}, headers=ADMIN).json()
    assert len(only) == 1 and only[0]["new_value"] and "draining" in only[0]["new_value"]
    since = only[0]["at"]
    assert all(e["at"] >= since for e in client.get("/api/v1/audit", params={"since": since}, headers=ADMIN).json())
    assert (
        client.get(
            "/api/v1/audit", params={"until": since, "who": operator["name"], "action": "hub.drain"}, headers=ADMIN
        ).json()
        == []
    )
    schema = client.get("/openapi.json").json()["paths"]
    assert set(schema["/api/v1/audit"]) == {"get"}


def test_a_rolled_back_action_leaves_neither_its_effect_nor_its_entry(client, role_tokens, monkeypatch):
    operator = role_tokens["operator"]
    real = audit.record

    def record_then_fail(conn, action, **kwargs):
        real(conn, action, **kwargs)
        raise RuntimeError("forced rollback after the audit entry was written")

    with transaction() as conn:
        entries_before = conn.execute(select(func.count()).select_from(audit_table)).scalar_one()
    monkeypatch.setattr(audit, "record", record_then_fail)
    r = client.post("/api/v1/routes/api/validated/pause", headers=operator["headers"])
    assert r.status_code == 500
    monkeypatch.setattr(audit, "record", real)
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(audit_table)).scalar_one() == entries_before
        assert conn.execute(select(route_pauses).where(route_pauses.c.route == "api.validated")).first() is None
