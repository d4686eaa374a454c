"""The HTTP API's status codes (openhub/api/README.md) on both backends, against the real store."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from sqlalchemy import func, select

import openhub
from openhub.api.problems import STATUS_BY_ERROR, status_for
from openhub.core import errors
from openhub.store.schema import messages
from tests.integration.api.conftest import ADMIN, CRM, SHOP, bearer, make_client
from tests.integration.api.extra_routes import OPERATOR_NAMED
from tests.support import backends
from tests.support.process_store import transaction


def stored(correlation_id: str, source_system: str | None = None) -> int:
    """How many messages carry this correlation id."""
    query = select(func.count()).select_from(messages).where(messages.c.correlation_id == correlation_id)
    if source_system:
        query = query.where(messages.c.source_system == source_system)
    with transaction() as conn:
        return conn.execute(query).scalar_one()


def post(client, cid, payload, route="test/flow", headers=CRM, **extra):
    return client.post(f"/api/v1/messages/{route}", json=payload, headers={**headers, "X-Correlation-Id": cid, **extra})


# --- the translation boundary --------------------------------------------------------------------
def test_every_openhub_error_has_a_status():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    missing = [c.__name__ for c in subclasses(errors.OpenHubError) if c not in STATUS_BY_ERROR]
    assert missing == []
    assert status_for(errors.UnknownRouteError("x")) == 404
    assert status_for(errors.PayloadTooLarge("x")) == 413
    assert status_for(errors.InputError("x")) == 400
    assert status_for(errors.StoreUnavailable("x")) == 503


# --- accept ----------------------------------------------------------------------------------------
def test_submit_is_stored_before_202(client, cid, flow_payload):
    r = post(client, cid, flow_payload, **{"X-Process-Id": "p-1", "X-Message-Timestamp": "2026-01-02T03:04:05Z"})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["correlation_id"] == cid and body["duplicate"] is False and body["route"] == "test.flow"
    view = openhub.get_message(body["id"])
    assert view.source_system == "CRM" and view.process_id == "p-1" and view.payload == flow_payload
    assert view.msg_timestamp.isoformat().startswith("2026-01-02T03:04:05")


def test_an_expiry_header_is_stored_with_the_message(client, cid, flow_payload):
    r = post(client, cid, flow_payload, **{"X-Expires-At": "2099-01-02T03:04:05+01:00"})
    assert r.status_code == 202, r.text
    assert openhub.get_message(r.json()["id"]).expires_at.isoformat() == "2099-01-02T02:04:05+00:00"


def test_a_priority_header_or_field_is_stored_and_shown_and_a_bad_one_stores_nothing(client, cid, flow_payload):
    r = post(client, cid, flow_payload, **{"X-Priority": "8"})
    assert r.status_code == 202, r.text
    assert openhub.get_message(r.json()["id"]).priority == 8
    assert client.get(f"/api/v1/messages/{r.json()['id']}", headers=ADMIN).json()["priority"] == 8  # the detail
    assert openhub.get_message(post(client, f"{cid}-none", flow_payload).json()["id"]).priority == 4  # the default
    for bad in ("10", "-1", "high"):
        refused = post(client, f"{cid}-{bad}", flow_payload, **{"X-Priority": bad})
        assert refused.status_code == 400 and "X-Priority" in refused.json()["detail"], refused.text
        assert stored(f"{cid}-{bad}") == 0
    batch = {
        "messages": [
            {"route": "test.flow", "payload": flow_payload, "correlation_id": f"{cid}-b{n}", "priority": n}
            for n in (0, 9)
        ]
    }
    r = client.post("/api/v1/messages:batch", json=batch, headers=CRM)
    assert r.status_code == 202, r.text
    assert [openhub.get_message(m["id"]).priority for m in r.json()["messages"]] == [0, 9]
    batch["messages"][1].update(priority=12, correlation_id=f"{cid}-b12")
    batch["messages"][0]["correlation_id"] = f"{cid}-b0-again"
    assert client.post("/api/v1/messages:batch", json=batch, headers=CRM).status_code == 400
    assert stored(f"{cid}-b0-again") == 0  # all or nothing


def test_duplicate_correlation_id_answers_the_first_message(client, cid, flow_payload):
    first = post(client, cid, flow_payload)
    again = post(client, cid, {**flow_payload, "changed": True})
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["duplicate"] is True and again.json()["id"] == first.json()["id"]
    assert stored(cid) == 1
    assert openhub.get_message(first.json()["id"]).payload == flow_payload
    # the same correlation id from another source system is another message
    assert post(client, cid, flow_payload, headers=SHOP).status_code == 202
    assert stored(cid) == 2


def test_text_and_xml_bodies_are_stored_as_a_string(client, cid):
    r = client.post(
        "/api/v1/messages/test/flow",
        content="<a>1</a>",
        headers={**CRM, "X-Correlation-Id": cid, "Content-Type": "application/xml"},
    )
    assert r.status_code == 202, r.text
    assert openhub.get_message(r.json()["id"]).payload == "<a>1</a>"
    r = client.post(
        "/api/v1/messages/test/flow",
        content="hello",
        headers={**CRM, "X-Correlation-Id": cid + "t", "Content-Type": "text/plain; charset=utf-8"},
    )
    assert r.status_code == 202 and openhub.get_message(r.json()["id"]).payload == "hello"


@pytest.mark.parametrize(
    "body, headers, why",
    [
        (b"{not json", {"Content-Type": "application/json"}, "not JSON"),
        (b"", {"Content-Type": "application/json"}, "empty"),
        (b'{"a": NaN}', {"Content-Type": "application/json"}, "NaN"),
        (b'"\\ud800"', {"Content-Type": "application/json"}, "lone surrogate"),
        (b'{"prefix": "/x"}', {"Content-Type": "application/json", "X-Message-Timestamp": "yesterday"}, "timestamp"),
        (
            b'{"prefix": "/x"}',
            {"Content-Type": "application/json", "X-Message-Timestamp": "9999-12-31T23:59:59-05:00"},
            "timestamp past datetime's range once in UTC",
        ),
        (b'{"prefix": "/x"}', {"Content-Type": "application/json", "X-Expires-At": "soon"}, "expiry"),
        (
            b'{"prefix": "/x"}',
            {"Content-Type": "application/json", "X-Expires-At": "2020-01-01T00:00:00Z"},
            "expiry already past",
        ),
    ],
)
def test_bad_payloads_are_400_and_nothing_is_stored(client, cid, body, headers, why):
    r = client.post("/api/v1/messages/test/flow", content=body, headers={**CRM, "X-Correlation-Id": cid, **headers})
    assert r.status_code == 400, (why, r.text)
    assert r.json()["status"] == 400 and r.json()["detail"]
    assert stored(cid) == 0


def test_missing_correlation_id_is_400_in_plain_words(client, flow_payload):
    r = client.post("/api/v1/messages/test/flow", json=flow_payload, headers=CRM)
    assert r.status_code == 400 and r.json()["detail"] == "the X-Correlation-Id header is required"


def test_payload_refused_by_route_validation_is_400(client, cid):
    r = post(client, cid, {"nope": 1}, route="api/validated")
    assert r.status_code == 400 and "validation" in r.json()["detail"]
    assert stored(cid) == 0


def test_a_refusal_by_a_pydantic_model_names_the_field_and_why(client, cid):
    r = post(client, cid, {"name": "Ada", "age": "old"}, route="api/typed")
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail == (
        "payload refused by the validation of route api.typed: externalCustomerId: Field required; "
        "age: Input should be a valid integer, unable to parse string as an integer"
    ), detail
    assert stored(cid) == 0


@pytest.mark.parametrize("path", ["customer.setCustomer", "test.flow"])
def test_a_dotted_route_in_the_url_is_answered_with_the_right_url(client, cid, flow_payload, path):
    r = post(client, cid, flow_payload, route=path)
    service, operation = path.split(".")
    assert r.status_code == 404, r.text
    assert f"POST /api/v1/messages/{service}/{operation}" in r.json()["detail"]
    assert stored(cid) == 0


def test_unknown_route_is_404(client, cid, flow_payload):
    r = post(client, cid, flow_payload, route="no/such")
    # Issue 40: the answer listed every route of the hub to a source system's key, which GET /api/v1/routes
    # refuses (the operators' alone).
    assert r.status_code == 404 and r.json()["detail"] == "unknown route 'no.such'", r.text
    batch = client.post(
        "/api/v1/messages:batch",
        headers=CRM,
        json={
            "messages": [
                {"route": "test.flow", "payload": flow_payload, "correlation_id": cid},
                {"route": "no.such", "payload": flow_payload, "correlation_id": f"{cid}-2"},
            ]
        },
    )
    assert batch.status_code == 404 and batch.json()["detail"] == "message #1: unknown route 'no.such'", batch.text
    assert stored(cid) == 0


def test_payload_over_the_limit_is_413_before_it_is_read(api_env, cid):
    from openhub.api.app import with_settings

    with make_client(settings=with_settings(max_payload_bytes=1000)) as small:
        r = post(small, cid, {"prefix": "/x", "blob": "x" * 2000})
        assert r.status_code == 413
        # no Content-Length (chunked): counted while streaming

        def body():
            yield b'{"prefix": "/x", "blob": "'
            for _ in range(10):
                yield b"x" * 200
            yield b'"}'

        r = small.post(
            "/api/v1/messages/test/flow",
            content=body(),
            headers={**CRM, "X-Correlation-Id": cid, "Content-Type": "application/json"},
        )
        assert r.status_code == 413, r.text
        assert post(small, cid, {"prefix": "/x"}).status_code == 202
    assert stored(cid) == 1


@pytest.mark.parametrize("content_type", [None, "text/html", "application/x-www-form-urlencoded", "image/png"])
def test_unsupported_media_type_is_415(client, cid, content_type):
    headers = {**CRM, "X-Correlation-Id": cid}
    if content_type:
        headers["Content-Type"] = content_type
    r = client.post("/api/v1/messages/test/flow", content=b"a=1", headers=headers)
    assert r.status_code == 415, r.text
    assert stored(cid) == 0


# --- batch -----------------------------------------------------------------------------------------
def test_batch_is_accepted_whole(client, cid, prefix):
    body = {
        "messages": [
            {"route": "test.flow", "payload": {"prefix": prefix}, "correlation_id": cid + "-1"},
            {
                "service": "test",
                "operation": "flow",
                "payload": {"prefix": prefix},
                "correlation_id": cid + "-2",
                "process_id": "p",
                "msg_timestamp": "2026-01-01T00:00:00+01:00",
            },
        ]
    }
    r = client.post("/api/v1/messages:batch", json=body, headers=CRM)
    assert r.status_code == 202, r.text
    assert [m["correlation_id"] for m in r.json()["messages"]] == [cid + "-1", cid + "-2"]
    assert stored(cid + "-1") == stored(cid + "-2") == 1
    again = client.post("/api/v1/messages:batch", json=body, headers=CRM)
    assert again.status_code == 200 and all(m["duplicate"] for m in again.json()["messages"])
    assert stored(cid + "-1") == 1


@pytest.mark.parametrize(
    "bad, status",
    [
        ({"route": "no.such", "payload": {}, "correlation_id": "X"}, 404),
        ({"route": "test.flow", "payload": {}}, 400),
        ({"route": "api.validated", "payload": {"nope": 1}, "correlation_id": "X"}, 400),
        ({"payload": {}, "correlation_id": "X"}, 400),
        ({"route": "test.flow", "payload": {}, "correlation_id": "X", "source_system": "SHOP"}, 403),
        (
            {"route": "test.flow", "payload": {}, "correlation_id": "X", "msg_timestamp": "9999-12-31T23:00:00-05:00"},
            400,
        ),
    ],
)
def test_batch_is_all_or_nothing(api_env, client, cid, prefix, bad, status):
    bad = {**bad, "correlation_id": cid + "-bad"} if "correlation_id" in bad else bad
    body = {
        "messages": [
            {"route": "test.flow", "payload": {"prefix": prefix}, "correlation_id": cid + "-ok1"},
            {"route": "test.flow", "payload": {"prefix": prefix}, "correlation_id": cid + "-ok2"},
            bad,
        ]
    }
    r = client.post("/api/v1/messages:batch", json=body, headers=CRM)
    assert r.status_code == status, r.text
    assert stored(cid + "-ok1") == stored(cid + "-ok2") == stored(cid + "-bad") == 0


def test_batch_shape_errors_are_400(client):
    for body in ({"messages": []}, {"messages": "x"}, [], {"other": 1}):
        assert client.post("/api/v1/messages:batch", json=body, headers=CRM).status_code == 400
    r = client.post("/api/v1/messages:batch", content=b"x", headers={**CRM, "Content-Type": "text/plain"})
    assert r.status_code == 415


# --- reading ---------------------------------------------------------------------------------------
def test_detail_has_calls_children_confirmation_and_history(client, cid, flow_payload):
    message_id = post(client, cid, flow_payload).json()["id"]
    r = client.get(f"/api/v1/messages/{message_id}", headers=ADMIN)
    assert r.status_code == 200
    m = r.json()
    for key in ("ext_calls", "children", "confirmation", "history", "payload", "state", "failed_error"):
        assert key in m
    assert m["history"][0]["event"] == "accepted"
    assert client.get("/api/v1/messages/999999999", headers=ADMIN).status_code == 404
    assert client.get("/api/v1/messages/abc", headers=ADMIN).status_code == 400
    assert client.get(f"/api/v1/messages/{2**63}", headers=ADMIN).status_code == 400


def test_search_filters_and_cursor(client, cid, prefix):
    ids = [
        post(client, f"{cid}-{i}", {"prefix": prefix}, headers=SHOP, **{"X-Process-Id": cid}).json()["id"]
        for i in range(3)
    ]
    page = client.get("/api/v1/messages", params={"source_system": "SHOP", "limit": 2}, headers=ADMIN).json()
    assert [m["id"] for m in page["items"]] == ids[::-1][:2] and page["next_cursor"] == ids[1]
    rest = client.get(
        "/api/v1/messages", params={"source_system": "SHOP", "limit": 2, "cursor": page["next_cursor"]}, headers=ADMIN
    ).json()
    assert rest["items"][0]["id"] == ids[0]
    one = client.get(
        "/api/v1/messages", params={"correlation_id": f"{cid}-1", "service": "test", "operation": "flow"}, headers=ADMIN
    ).json()
    assert [m["id"] for m in one["items"]] == [ids[1]] and one["next_cursor"] is None
    received = openhub.get_message(ids[1]).received_at.isoformat()
    window = client.get(
        "/api/v1/messages", params={"received_from": received, "source_system": "SHOP"}, headers=ADMIN
    ).json()
    assert {m["id"] for m in window["items"]} >= {ids[1], ids[2]} and ids[0] not in {m["id"] for m in window["items"]}
    for bad in (
        {"state": "BOGUS"},
        {"limit": 0},
        {"limit": 5000},
        {"received_from": "then"},
        {"service": "a\x00b"},
        {"cursor": -1},
        {"received_to": "0001-01-01T00:00:00+05:00"},
    ):
        assert client.get("/api/v1/messages", params=bad, headers=ADMIN).status_code == 400, bad


# --- operator actions ------------------------------------------------------------------------------
def test_restart_cancel_respond_conflicts(client, cid, flow_payload):
    message_id = post(client, cid, flow_payload).json()["id"]
    # not final yet: restart is a conflict
    assert client.post(f"/api/v1/messages/{message_id}:restart", headers=ADMIN).status_code in (409, 200)
    view = openhub.get_message(message_id)
    if view.state not in ("OK", "FAILED", "CANCEL", "SKIPPED"):
        r = client.post(f"/api/v1/messages/{message_id}:cancel", headers=ADMIN)
        assert r.status_code == 200 and r.json()["state"] == "CANCEL"
    assert client.post(f"/api/v1/messages/{message_id}:cancel", headers=ADMIN).status_code == 409
    r = client.post(f"/api/v1/messages/{message_id}:response", json={"answer": 1}, headers=ADMIN)
    assert r.status_code == 409
    assert client.post("/api/v1/messages/999999999:restart", headers=ADMIN).status_code == 404
    assert client.post("/api/v1/messages/999999999:cancel", headers=ADMIN).status_code == 404
    r = client.post(f"/api/v1/messages/{message_id}:restart", json={"total": "maybe"}, headers=ADMIN)
    assert r.status_code == 400


@pytest.mark.parametrize("route", OPERATOR_NAMED)
def test_a_route_named_like_an_operator_action_is_submitted_and_the_actions_still_work(client, cid, route):
    # Issue 40: `POST /messages/order/cancel` with CRM's key answered 403 "this endpoint needs the admin
    # token", and `/messages/shipment/restart` with the admin token 400 "path.message_id: ... integer":
    # the operator's `/messages/{id}/<action>` paths took the submission of routes named `*.<action>`.
    service, operation = route.split(".")
    r = post(client, cid, {"n": 1}, route=f"{service}/{operation}")
    assert r.status_code == 202, r.text
    assert r.json()["route"] == route and openhub.get_message(r.json()["id"]).source_system == "CRM"
    refused = post(client, f"{cid}-admin", {"n": 1}, route=f"{service}/{operation}", headers=ADMIN)
    assert refused.status_code == 403 and "submit" in refused.json()["detail"], refused.text  # the submission's refusal

    # The operator's actions, on their paths (`/messages/{id}:<action>`), with the admin token alone.
    message_id = r.json()["id"]
    assert client.post(f"/api/v1/messages/{message_id}:cancel", headers=CRM).status_code == 403
    if openhub.get_message(message_id).state not in ("OK", "CANCEL"):  # a worker may have carried it to OK
        assert client.post(f"/api/v1/messages/{message_id}:cancel", headers=ADMIN).json()["state"] == "CANCEL"
    assert client.post(f"/api/v1/messages/{message_id}:restart", headers=ADMIN).status_code == 200
    assert client.post(f"/api/v1/messages/{message_id}:response", json={}, headers=ADMIN).status_code == 409


def test_the_old_operator_paths_answer_for_numeric_ids_and_name_their_successor(client, cid, flow_payload):
    # Kept one release where they cannot be a route's submission: a service name starts with a letter.
    message_id = post(client, cid, flow_payload).json()["id"]
    openhub.cancel(message_id) if openhub.get_message(message_id).state not in ("OK", "CANCEL") else None
    r = client.post(f"/api/v1/messages/{message_id}/restart", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.headers["Link"] == f'</api/v1/messages/{message_id}:restart>; rel="successor-version"'
    assert client.post(f"/api/v1/messages/{message_id}/response", json={}, headers=ADMIN).status_code == 409
    assert client.post("/api/v1/messages/999999999/cancel", headers=ADMIN).status_code == 404
    doc = client.get("/openapi.json").json()["paths"]
    assert doc["/api/v1/messages/{message_id}/cancel"]["post"]["deprecated"] is True
    assert "deprecated" not in doc["/api/v1/messages/{message_id}:cancel"]["post"]


def test_count_matches_the_search_and_keeps_a_source_system_to_its_own(client, flow_payload):
    process = f"p-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        post(client, f"c-{uuid.uuid4().hex[:12]}", flow_payload, **{"X-Process-Id": process})
    assert client.get("/api/v1/messages:count", params={"process_id": process}, headers=ADMIN).json() == {"total": 3}
    assert client.get("/api/v1/messages:count", params={"process_id": process}, headers=CRM).json() == {"total": 3}
    assert client.get("/api/v1/messages:count", params={"process_id": process}, headers=SHOP).json() == {"total": 0}
    r = client.get("/api/v1/messages:count", params={"source_system": "CRM"}, headers=SHOP)
    assert r.status_code == 403
    assert openhub.count_messages(process_id=process) == 3


def test_bulk_cancel_and_restart_by_filter(client, flow_payload):
    process = f"p-{uuid.uuid4().hex[:8]}"
    ids = [
        post(client, f"c-{uuid.uuid4().hex[:12]}", flow_payload, **{"X-Process-Id": process}).json()["id"]
        for _ in range(2)
    ]
    assert client.post("/api/v1/messages:cancel", json={"process_id": process}, headers=CRM).status_code == 403
    assert client.post("/api/v1/messages:cancel", json={}, headers=ADMIN).status_code == 400
    assert client.post("/api/v1/messages:cancel", json={"process": process}, headers=ADMIN).status_code == 400
    both = {"process_id": process, "route": "test.flow", "service": "test"}
    assert client.post("/api/v1/messages:cancel", json=both, headers=ADMIN).status_code == 400
    found = client.get("/api/v1/messages", params={"process_id": process}, headers=ADMIN).json()["items"]
    assert sorted(m["id"] for m in found) == sorted(ids)
    r = client.post("/api/v1/messages:cancel", json={"process_id": process, "route": "test.flow"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    done = r.json()
    # A worker (if one runs) may have finished a message first: it is not matched, or refused.
    assert set(done["done"]) | {x["id"] for x in done["refused"]} <= set(ids) and done["more"] is False
    cancelled = [i for i in ids if openhub.get_message(i).state == "CANCEL"]
    assert cancelled == done["done"]
    again = client.post("/api/v1/messages:restart", json={"process_id": process, "state": "CANCEL"}, headers=ADMIN)
    assert again.status_code == 200 and again.json()["done"] == cancelled
    assert all(openhub.get_message(i).state != "CANCEL" for i in ids)


def test_restart_of_a_cancelled_message(client, cid, flow_payload):
    message_id = post(client, cid, flow_payload).json()["id"]
    openhub.cancel(message_id) if openhub.get_message(message_id).state not in ("OK", "CANCEL") else None
    r = client.post(f"/api/v1/messages/{message_id}:restart", json={"total": True}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["failed_count"] == 0


def test_routes_pause_and_resume(client):
    listed = client.get("/api/v1/routes", headers=ADMIN).json()
    assert "test.held" in {r["route"] for r in listed}
    assert client.post("/api/v1/routes/test/held/pause", headers=ADMIN).json() == {"route": "test.held", "paused": True}
    assert openhub.paused().get("test.held")
    assert [r for r in client.get("/api/v1/routes", headers=ADMIN).json() if r["route"] == "test.held"][0]["paused"]
    r = client.post("/api/v1/routes/test/held/resume", headers=ADMIN)
    assert r.status_code == 200 and r.json()["paused"] is False
    assert "test.held" not in openhub.paused()
    assert client.post("/api/v1/routes/no/such/pause", headers=ADMIN).status_code == 404


# --- health, store down ----------------------------------------------------------------------------
def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_store_down_is_503_and_nothing_is_accepted(api_env, cid, flow_payload):
    closed = backends.free_port()
    down = dict(api_env.env, OPENHUB_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{closed}/nowhere")
    backends.activate(down)
    try:
        with make_client() as c:
            r = post(c, cid, flow_payload)
            assert r.status_code == 503, r.text
            assert r.headers.get("Retry-After")
            batch = {"messages": [{"route": "test.flow", "payload": flow_payload, "correlation_id": cid + "b"}]}
            assert c.post("/api/v1/messages:batch", json=batch, headers=CRM).status_code == 503
            assert c.get("/api/v1/messages", headers=ADMIN).status_code == 503
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["database"] == "unavailable"
            # Driver text (host, port, database name) stays in the log, out of the answers.
            for answer in (r, ready):
                assert str(closed) not in answer.text and "nowhere" not in answer.text and "psycopg" not in answer.text
            assert c.get("/metrics", headers=ADMIN).status_code == 200  # a scrape survives the store being down
    finally:
        api_env.activate()
    assert stored(cid) == 0 and stored(cid + "b") == 0


def test_broker_down_makes_readyz_503(api_env):
    backends.activate(dict(api_env.env, OPENHUB_BROKER_URL=f"redis://127.0.0.1:{backends.free_port()}/0"))
    try:
        with make_client() as c:
            r = c.get("/readyz")
            assert r.status_code == 503 and r.json()["checks"]["broker"] == "unavailable"
            assert r.json()["checks"]["database"] == "ok"
    finally:
        api_env.activate()


def test_openapi_documents_every_endpoint(client):
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    for path, method in [
        ("/api/v1/messages/{service}/{operation}", "post"),
        ("/api/v1/messages:batch", "post"),
        ("/api/v1/messages", "get"),
        ("/api/v1/messages/{message_id}", "get"),
        ("/api/v1/messages/{message_id}:restart", "post"),
        ("/api/v1/messages/{message_id}:cancel", "post"),
        ("/api/v1/messages/{message_id}:response", "post"),
        ("/api/v1/routes", "get"),
        ("/api/v1/routes/{service}/{operation}/pause", "post"),
        ("/api/v1/routes/{service}/{operation}/resume", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths[path], path
    submit = paths["/api/v1/messages/{service}/{operation}"]["post"]
    assert {"202", "200", "400", "401", "403", "404", "413", "415", "429", "503"} <= set(submit["responses"])
    assert set(submit["requestBody"]["content"]) == {"application/json", "text/plain", "application/xml"}
    assert "Batch" in doc["components"]["schemas"]
    assert json.dumps(doc)  # serialisable


def test_openapi_documents_400_with_the_problem_body_and_no_422(client):
    # Issue 27: FastAPI documented 422 (HTTPValidationError) where the API answers 400 {"status", "detail"}.
    doc = client.get("/openapi.json").json()
    assert "422" not in json.dumps(doc["paths"])
    assert not {"HTTPValidationError", "ValidationError"} & set(doc["components"]["schemas"])
    problem = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if operation.get("parameters") or "requestBody" in operation:  # FastAPI validates these
                assert operation["responses"]["400"]["content"] == problem, (method, path)
    assert doc["components"]["schemas"]["Problem"]["required"] == ["status", "detail"]
    r = client.get("/api/v1/messages", params={"limit": "many"}, headers=ADMIN)
    assert r.status_code == 400 and set(r.json()) == {"status", "detail"}


def test_starlettes_own_refusals_have_the_problem_body_and_the_whole_allow(client):
    # Found by bench/fuzz_api.py (schemathesis): a body that is not JSON answered {"detail"} alone, and
    # a 405 on /api/v1/drain said `Allow: GET` though PUT and DELETE are there too.
    r = client.post("/api/v1/messages:cancel", content=b"\xff", headers={**ADMIN, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json() == {"status": 400, "detail": "There was an error parsing the body"}
    r = client.post("/api/v1/drain", headers=ADMIN)
    assert r.status_code == 405 and r.json()["status"] == 405
    assert r.headers["Allow"] == "DELETE, GET, PUT"
    r = client.get("/api/v1/no-such-thing", headers=ADMIN)
    assert r.status_code == 404 and r.json() == {"status": 404, "detail": "Not Found"}


def test_openapi_says_what_the_filters_refuse(client):
    # Found by bench/fuzz_api.py: documented as any string, a filter with a control character was refused.
    doc = client.get("/openapi.json").json()
    params = {p["name"]: p["schema"] for p in doc["paths"]["/api/v1/messages"]["get"]["parameters"]}
    pattern = re.compile(params["process_id"]["pattern"])
    assert pattern.match("order-17/ü") and not pattern.match("a\x1bb") and not pattern.match("a\x9bb")
    states = doc["paths"]["/api/v1/confirmations"]["get"]["parameters"][0]["schema"]
    assert "PARKED" not in json.dumps(states) and "FAILED_END" in json.dumps(doc["components"]["schemas"])
    r = client.get("/api/v1/confirmations", params={"state": "PARKED"}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["detail"].startswith("query.state:")


def test_access_log_has_ids_and_no_keys(client, cid, flow_payload, caplog):
    caplog.set_level("INFO", logger="openhub")
    message_id = post(client, cid, flow_payload).json()["id"]
    client.get(f"/api/v1/messages/{message_id}", headers=ADMIN)
    client.get("/api/v1/messages", headers=bearer("wrong-key-123"))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"correlation_id={cid} message_id={message_id}" in text
    for secret in (CRM["Authorization"].split()[1], ADMIN["Authorization"].split()[1], "wrong-key-123"):
        assert secret not in text


def test_response_resumes_a_waiting_message(api_env, hub, client, cid, prefix, external):
    from tests.support.waiting import wait_final, wait_state

    r = post(client, cid, {"prefix": prefix, "wait": 60}, route="test/wait")
    message_id = r.json()["id"]
    wait_state(message_id, "WAITING_FOR_RES")
    # The question gave its responder the URL to answer (ctx.response_url): it carries the wait's token.
    (url,) = [c.body["url"] for c in external.calls if c.path == f"{prefix}/callback"]
    assert url.startswith(f"http://testserver/api/v1/messages/{message_id}:response?token="), url
    # test.wait declares responders=["SHOP"]: the third party answers, not the system that asked (issue 27)
    refused = client.post(url, json={"approved": True}, headers=CRM)
    assert refused.status_code == 403 and "SHOP" in refused.json()["detail"], refused.text
    answer = client.post(url, json={"approved": True}, headers=SHOP)
    assert answer.status_code == 200 and answer.json()["duplicate"] is False, answer.text
    # The same answer again (a retry after a lost reply), whatever it says: 200, a duplicate, not kept.
    again = client.post(url, json={"approved": False}, headers=SHOP)
    assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
    done = wait_final(message_id)
    assert done.state == "OK" and done.custom_data["answer"] == {"approved": True}
    history = client.get(f"/api/v1/messages/{message_id}", headers=ADMIN).json()["history"]
    assert any(h["event"] == "responded" and "SHOP" in (h["detail"] or "") for h in history), history
    assert any(h["event"] == "response_duplicate" for h in history), history
    assert client.post(f"/api/v1/messages/{message_id}:response", json={}, headers=ADMIN).status_code == 409
    stale = client.post(
        f"/api/v1/messages/{message_id}:response", params={"token": "1.nothing-gave-this"}, json={}, headers=SHOP
    )
    assert stale.status_code == 409 and "no open wait" in stale.json()["detail"], stale.text
    bad = client.post(f"/api/v1/messages/{message_id}:response", params={"token": "x" * 65}, json={}, headers=SHOP)
    assert bad.status_code == 400, bad.text


def test_a_source_system_sees_its_message_without_the_hubs_internals(api_env, cid, flow_payload):
    # Issue 34 L2: custom_data (a token one step leaves the next), the trace link (an internal host) and
    # history details (who answered, what an operator did) were in the source system's view.
    backends.activate(dict(api_env.env, OPENHUB_TRACE_URL="https://jaeger.internal/trace/{trace_id}"))
    # Its route paused: the message stays live for the operator's cancel (a worker took it to OK before the
    # cancel once, in CI beside a soak: StateConflict).
    openhub.pause("test.held")
    try:
        with make_client() as client:
            message_id = post(client, cid, flow_payload, route="test/held").json()["id"]
            openhub.cancel(message_id)
            openhub.restart(message_id, total=True)
            mine = client.get(f"/api/v1/messages/{message_id}", headers=CRM).json()
            theirs = client.get(f"/api/v1/messages/{message_id}", headers=ADMIN).json()
            openhub.cancel(message_id)
    finally:
        openhub.resume("test.held")
    # The history only grows: the source system's is the start of the admin's, read after it.
    events = [h["event"] for h in mine["history"]]
    assert events[0] == "accepted" and events == [h["event"] for h in theirs["history"]][: len(events)], (mine, theirs)
    assert not {"http_exchanges", "custom_data", "trace_url"} & set(mine), sorted(mine)
    assert not [h for h in mine["history"] if "detail" in h], mine["history"]
    assert {"http_exchanges", "custom_data", "trace_url"} <= set(theirs)
    assert any(h["detail"] for h in theirs["history"]), theirs["history"]


def test_a_control_character_in_a_confirmations_filter_is_400_not_500(client):
    # Found by the in-suite fuzz on PostgreSQL: ?source_system=%00 reached the driver as a DataError (500).
    for name in ("\x00", "a\x1bb"):
        r = client.get("/api/v1/confirmations", params={"source_system": name}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["detail"] == "source_system must not contain control characters"
        r = client.post("/api/v1/confirmations:resend", json={"source_system": name}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["detail"] == "source_system must not contain control characters"
