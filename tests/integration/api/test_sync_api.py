"""Synchronous routes (issue 38 item 3): the HTTP caller waits for the route's result while real Celery workers
run its steps; past its wait it gets 202 and the message ends once, as any other."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.api.conftest import ADMIN, CRM
from tests.support.waiting import wait_final


def _submit(client, prefix: str, cid: str, prefer: str | None = None, route: str = "test/quote"):
    headers = {**CRM, "X-Correlation-Id": cid, **({"Prefer": prefer} if prefer else {})}
    return client.post(f"/api/v1/messages/{route}", json={"prefix": prefix, "n": 3}, headers=headers)


@pytest.mark.parametrize("route", ["test/quote", "fused/quote"], ids=["chain", "fused"])
def test_a_sync_route_answers_its_result(hub, client, external, prefix, route):
    cid = uuid.uuid4().hex
    r = _submit(client, prefix, cid, "wait=60", route)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["state"], answer["result"], answer["duplicate"]) == ("OK", {"quote": 30, "prefix": prefix}, False)
    # stored, guarded and visible like any other message, its result kept on it
    detail = client.get(f"/api/v1/messages/{answer['id']}", headers=ADMIN).json()
    assert (detail["state"], detail["result"]) == ("OK", {"quote": 30, "prefix": prefix})
    assert client.get(f"/api/v1/messages/{answer['id']}", headers=CRM).json()["result"] == answer["result"]
    # sent again, the same correlation id answers the same result: the steps did not run twice
    again = _submit(client, prefix, cid, "wait=60", route)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert (again.json()["id"], again.json()["result"]) == (answer["id"], answer["result"])
    assert external.count(f"{prefix}/quote") == 1 and external.count(f"{prefix}/a") == 1


def test_a_sync_route_slower_than_its_wait_answers_202_then_ends_ok_once(hub, client, external, prefix):
    external.delay(f"{prefix}/quote", 3.0)
    cid = uuid.uuid4().hex
    began = time.monotonic()
    r = _submit(client, prefix, cid, "wait=0.5")
    assert r.status_code == 202, r.text
    assert time.monotonic() - began < 2.5  # it waited its half second, not the step's 3 s
    assert r.json()["state"] not in ("OK", "FAILED")
    done = wait_final(r.json()["id"], timeout=120)
    assert (done.state, done.result) == ("OK", {"quote": 30, "prefix": prefix})
    assert external.count(f"{prefix}/quote") == 1 and external.effects(f"{prefix}/quote") == 1
    # the caller picks its result up by sending the same message again
    again = _submit(client, prefix, cid, "wait=5")
    assert (again.status_code, again.json()["result"], again.json()["duplicate"]) == (200, done.result, True)
    assert external.count(f"{prefix}/quote") == 1


def test_respond_async_and_a_failed_sync_message(hub, client, external, prefix):
    r = _submit(client, prefix, uuid.uuid4().hex, "respond-async")
    assert r.status_code == 202  # asked not to wait
    assert wait_final(r.json()["id"], timeout=120).state == "OK"
    external.fail(f"{prefix}/quote", times=1, status=422)  # refused for good: FAILED at once
    failed = _submit(client, prefix, uuid.uuid4().hex, "wait=60")
    assert failed.status_code == 422, failed.text
    body = failed.json()
    assert (body["state"], body["error_code"], body["result"]) == ("FAILED", "HTTP_422", None)
    assert "422" in body["error"]


def test_the_wait_is_capped_by_the_setting() -> None:
    from datetime import timedelta

    from openhub.api.sync import wait_seconds
    from openhub.core.config import Settings

    settings = Settings.from_env({"OPENHUB_SYNC_WAIT": "2", "OPENHUB_SYNC_MAX_WAIT": "5"})
    assert settings.sync_max_wait == timedelta(seconds=5)
    assert wait_seconds(None, settings) == 2
    assert wait_seconds("wait=3", settings) == 3
    assert wait_seconds("handling=lenient, wait=100", settings) == 5
    assert wait_seconds("respond-async, wait=10", settings) == 0
