"""Hostile input through HTTP on both backends: refused with a 4xx, quickly, and nothing stored."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import openhub
from openhub.api.throttle import Throttle
from openhub.core.config import get_settings
from tests.integration.api.conftest import ADMIN, CRM, SHOP, make_client


def nested_json(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def submit_raw(client, content, content_type="application/json", **headers):
    cid = headers.pop("cid", None) or uuid.uuid4().hex
    return cid, client.post(
        "/api/v1/messages/test/flow",
        content=content,
        headers={**CRM, "X-Correlation-Id": cid, "Content-Type": content_type, **headers},
    )


@pytest.mark.parametrize("charset", ["punycode", "idna", "rot13", "uu_codec", "zlib", "nonsense"])
def test_charsets_outside_the_allow_list_are_415_at_once(client, charset):
    started = time.monotonic()
    cid, r = submit_raw(client, b"\x80" * 400_000 + b"a", f"text/plain; charset={charset}")
    assert r.status_code == 415, r.text
    assert time.monotonic() - started < 15  # at once: decoding it would take minutes (bounded for a busy machine)
    assert openhub.list_messages(correlation_id=cid) == []


@pytest.mark.parametrize(
    "content_type, content",
    [
        ("text/plain; charset=utf-16", b"\x00\xd8a"),  # odd length and a lone surrogate
        ("application/json; charset=utf-32", b"\xff\xff\xff\xff"),
        ("text/plain; charset=ascii", "é".encode()),
    ],
)
def test_undecodable_bodies_are_400(client, content_type, content):
    cid, r = submit_raw(client, content, content_type)
    assert r.status_code == 400, r.text
    assert openhub.list_messages(correlation_id=cid) == []


def test_allowed_charsets_are_decoded(client):
    cid, r = submit_raw(client, "grüße".encode("utf-16"), "text/plain; charset=UTF-16")
    assert r.status_code == 202, r.text
    assert openhub.get_message(r.json()["id"]).payload == "grüße"
    cid, r = submit_raw(client, "grüße".encode("latin-1"), "text/plain; charset=iso-8859-1")
    assert r.status_code == 202 and openhub.get_message(r.json()["id"]).payload == "grüße"


@pytest.mark.parametrize("depth", [65, 255, 100_000])
def test_payload_nested_past_the_limit_is_400(client, depth):
    cid, r = submit_raw(client, nested_json(depth))
    assert r.status_code == 400, r.text
    assert openhub.list_messages(correlation_id=cid) == []
    batch = {"messages": [{"route": "test.flow", "correlation_id": cid, "payload": json.loads(nested_json(64))}]}
    text = json.dumps(batch).replace(nested_json(64), nested_json(depth)) if depth < 1000 else json.dumps(batch)
    if depth < 1000:
        r = client.post("/api/v1/messages:batch", content=text, headers={**CRM, "Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert openhub.list_messages(correlation_id=cid) == []


def test_payload_at_the_nesting_limit_is_readable_everywhere(client):
    deep = json.loads(nested_json(get_settings().max_nesting))
    cid, r = submit_raw(client, json.dumps(deep))
    assert r.status_code == 202, r.text
    message_id = r.json()["id"]
    assert client.get(f"/api/v1/messages/{message_id}", headers=ADMIN).json()["payload"] == deep
    assert client.get("/api/v1/messages", headers=ADMIN).status_code == 200
    assert client.get(f"/api/v1/messages?correlation_id={cid}", headers=CRM).json()["items"][0]["id"] == message_id


@pytest.mark.parametrize("bad", ["a\nb", "a\x1b[2Jb", "a\x00b", "a\u2028b", "a\x85b"])
def test_control_characters_in_correlation_ids_are_400_in_a_batch(client, bad):
    cid = uuid.uuid4().hex
    batch = {
        "messages": [
            {"route": "test.flow", "correlation_id": cid + bad, "payload": {}},
            {"route": "test.flow", "correlation_id": cid, "payload": {}},
        ]
    }
    r = client.post("/api/v1/messages:batch", json=batch, headers=CRM)
    assert r.status_code == 400, r.text
    assert "control characters" in r.json()["detail"]
    assert openhub.list_messages(correlation_id=cid) == []


def test_process_id_header_with_control_characters_is_400(client):
    cid, r = submit_raw(client, "{}", **{"X-Process-Id": "p\x1b[31m"})
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("stamp", ["9999-12-31T23:59:59Z", "2999-01-01T00:00:00+02:00"])
def test_far_future_timestamp_is_400(client, stamp):
    cid, r = submit_raw(client, "{}", **{"X-Message-Timestamp": stamp})
    assert r.status_code == 400 and "OPENHUB_MAX_CLOCK_SKEW" in r.json()["detail"], r.text
    assert openhub.list_messages(correlation_id=cid) == []
    batch = {"messages": [{"route": "test.flow", "correlation_id": cid, "payload": {}, "msg_timestamp": stamp}]}
    assert client.post("/api/v1/messages:batch", json=batch, headers=CRM).status_code == 400
    soon = (datetime.now(timezone.utc) + timedelta(seconds=30)).isoformat()
    assert submit_raw(client, "{}", **{"X-Message-Timestamp": soon})[1].status_code == 202


def test_throttling_is_checked_before_the_body_is_parsed(api_env):
    prefix = f"t-{uuid.uuid4().hex}:"
    throttle = Throttle.from_settings("CRM.flow=1/3600", get_settings().redis_url, prefix=prefix)
    with make_client(throttle=throttle) as client:
        assert submit_raw(client, "{}")[1].status_code == 202
        # Over the limit: 429 whatever the body, which is neither read nor parsed.
        _, r = submit_raw(client, "{not json")
        assert r.status_code == 429 and r.headers["Retry-After"], r.text


def test_a_batch_nothing_of_which_could_be_accepted_is_refused_before_parsing(api_env):
    throttle = Throttle.from_settings("CRM.*=0/3600", get_settings().redis_url, prefix=f"t-{uuid.uuid4().hex}:")
    with make_client(throttle=throttle) as client:
        r = client.post(
            "/api/v1/messages:batch", content=b"[" * 5_000_000, headers={**CRM, "Content-Type": "application/json"}
        )
        assert r.status_code == 429 and r.headers["Retry-After"], r.text
        # another system, not throttled, is parsed as before
        r = client.post(
            "/api/v1/messages:batch", content=b"[" * 10, headers={**SHOP, "Content-Type": "application/json"}
        )
        assert r.status_code == 400, r.text


def test_a_list_carries_summaries_without_payloads(api_env):
    big = {"blob": "x" * 900_000}
    with make_client() as client:
        prefix = uuid.uuid4().hex
        ids = [submit_raw(client, json.dumps(big), **{"X-Process-Id": prefix})[1].json()["id"] for _ in range(3)]
        r = client.get("/api/v1/messages", params={"limit": 3}, headers=ADMIN)
        assert r.status_code == 200
        assert len(r.content) < 10_000  # three 900 KB payloads are not in the page
        items = r.json()["items"]
        assert [m["id"] for m in items] == ids[::-1]
        assert all("payload" not in m and "custom_data" not in m and m["process_id"] == prefix for m in items)
        assert client.get(f"/api/v1/messages/{ids[0]}", headers=ADMIN).json()["payload"] == big


@pytest.mark.parametrize("field", ["correlation_id", "object_id", "source_system", "error_code"])
def test_a_search_with_a_control_character_is_400_not_a_driver_error(client, field):
    # PostgreSQL cannot compare a NUL at all; no stored id holds a control character either.
    for value in ("\x00x", "a\nb"):
        r = client.get("/api/v1/messages", params={field: value}, headers=ADMIN)
        assert r.status_code == 400, (value, r.status_code, r.text[:300])
        with pytest.raises(openhub.InputError, match="control characters"):
            openhub.list_messages(**{field: value})


def test_bodies_are_decoded_off_the_event_loop(client, monkeypatch):
    import asyncio

    from openhub.api import body

    on_loop: list[bool] = []

    def spy(real):
        def decode(*args):
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:
                on_loop.append(False)
            return real(*args)

        return decode

    monkeypatch.setattr(body, "decode_payload", spy(body.decode_payload))
    monkeypatch.setattr(body, "decode_json", spy(body.decode_json))
    assert submit_raw(client, '{"a": 1}')[1].status_code == 202
    batch = {"messages": [{"route": "test.flow", "correlation_id": uuid.uuid4().hex, "payload": {}}]}
    assert client.post("/api/v1/messages:batch", json=batch, headers=CRM).status_code == 202
    assert on_loop and not any(on_loop), on_loop  # a 10 MB parse would otherwise stall every connection


def test_a_nul_in_a_derived_object_id_is_400_naming_the_field(client):
    cid = uuid.uuid4().hex
    r = client.post("/api/v1/messages/test/entity", json={"id": "a\u0000b"}, headers={**CRM, "X-Correlation-Id": cid})
    assert r.status_code == 400 and "object_id" in r.text, r.text
    assert openhub.list_messages(correlation_id=cid) == []


@pytest.mark.parametrize("path", ["/api/v1/messages", "/api/v1/messages:count"])
@pytest.mark.parametrize("value", ["0.5", "0", "1700000000", " 1e3"])
@pytest.mark.parametrize("name", ["received_from", "received_to"])
def test_a_number_given_as_a_query_timestamp_is_400_naming_it(client, path, name, value):
    # Issue 27: `received_to=0.5` was read as 0.5 s after 1970 and answered 200.
    r = client.get(path, params={name: value}, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == f"query.{name}: Value error, must be an ISO 8601 timestamp, not a number"
    assert client.get(path, params={name: "2026-11-21T00:00:00Z"}, headers=ADMIN).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/messages:restart", "/api/v1/messages:cancel"])
@pytest.mark.parametrize(
    "field, value",
    [("received_to", 0.5), ("received_from", "1700000000"), ("limit", "5"), ("limit", 5.0), ("parent_id", "1")],
)
def test_a_bulk_filter_of_the_wrong_type_is_400_naming_it(client, path, field, value):
    r = client.post(path, json={"state": "FAILED" if path.endswith("restart") else "NEW", field: value}, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["detail"].startswith(f"body.{field}: ")


@pytest.mark.parametrize("total", [0, 1, "true", "yes", None])
def test_restart_total_must_be_a_boolean(client, total):
    # Issue 27: `{"total": 0}` was coerced to false (and "yes" to true) instead of refused.
    message = openhub.submit("test.flow", {"prefix": "x", "n": 1}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    r = client.post(f"/api/v1/messages/{message.id}:restart", json={"total": total}, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["detail"].startswith("body.total: ")
    r = client.post("/api/v1/messages:restart", json={"state": "FAILED", "total": total}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["detail"].startswith("body.total: "), r.text
    assert (
        client.post("/api/v1/messages:restart", json={"state": "FAILED", "total": True}, headers=ADMIN).status_code
        == 200
    )


@pytest.mark.parametrize("cid", ["bestellung-ü-1", "注文-2"])
def test_a_non_ascii_correlation_id_in_a_header_is_stored_as_sent(client, cid):
    """Issue 34 L1: UTF-8 bytes in X-Correlation-Id were read as Latin-1 (`bestellung-Ã¼-1` stored)."""
    cid = f"{cid}-{uuid.uuid4().hex[:6]}"
    r = client.post(
        "/api/v1/messages/test/held",
        json={},
        headers={**CRM, "X-Correlation-Id": cid.encode(), "X-Process-Id": "prozess-ß".encode()},
    )
    assert r.status_code == 202 and r.json()["correlation_id"] == cid, r.text
    stored = openhub.get_message(r.json()["id"])
    assert (stored.correlation_id, stored.process_id) == (cid, "prozess-ß")
    openhub.cancel(stored.id)
