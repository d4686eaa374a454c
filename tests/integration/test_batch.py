"""Batch routes (`Route(batch=N)`) on LocalHub, which runs them through the workers' batch runner
(openhub.batch): many messages per task, each step entered and recorded for all of them in one
transaction, every promise kept per message. On SQLite, then on PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from typing import Iterator

import pytest
from sqlalchemy import select

import openhub
from openhub.db import transaction
from openhub.schema import Base, transitions
from openhub.testing import ExternalSystem, LocalHub
from tests.support.waiting import wait_for


@pytest.fixture
def external(monkeypatch: pytest.MonkeyPatch) -> Iterator[ExternalSystem]:
    system = ExternalSystem().start()
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", system.url)
    yield system
    system.stop()


@pytest.fixture
def hub(local_store_env: dict[str, str], external: ExternalSystem) -> Iterator[LocalHub]:
    if "OPENHUB_DATABASE_URL" in local_store_env:  # the shared PostgreSQL store, emptied for this test
        with transaction(local_store_env["OPENHUB_DATABASE_URL"]) as conn:
            conn.exec_driver_sql(f"TRUNCATE {', '.join(t.name for t in Base.metadata.sorted_tables)} "
                                 "RESTART IDENTITY CASCADE")
    with LocalHub("tests.support.routes", OPENHUB_RETRY_INTERVAL="60", **local_store_env) as local:
        yield local


def _prefix() -> str:
    return f"/b{uuid.uuid4().hex[:8]}"


def _history(message_id: int) -> list[str]:
    with transaction() as conn:
        return list(conn.execute(select(transitions.c.event).where(transitions.c.message_id == message_id)
                                 .order_by(transitions.c.id)).scalars())


def test_a_batch_carries_its_messages_step_by_step_each_step_called_once(hub: LocalHub,
                                                                        external: ExternalSystem) -> None:
    prefix = _prefix()
    ids = [hub.submit("batched.flow", {"prefix": prefix, "n": n}).id for n in range(5)]
    assert len(hub.publisher.chains) == 5
    assert hub.run() == 5
    assert all(hub.get(i).state == "OK" for i in ids)
    for name in "abc":
        assert external.count(f"{prefix}/{name}") == 5 and external.effects(f"{prefix}/{name}") == 5
    # Lockstep: every message's step a ended before any step b began (one task carried them all).
    calls = [c for c in external.calls if c.path.startswith(prefix)]
    last_a = max(c.ended for c in calls if c.path.endswith("/a"))
    assert last_a <= min(c.started for c in calls if c.path.endswith("/b"))


def test_mixed_outcomes_in_one_batch_each_go_their_own_way(hub: LocalHub, external: ExternalSystem) -> None:
    prefixes = {name: _prefix() for name in ("ok", "transient", "reject", "postpone", "no_effect")}
    scripts = {"reject": {"b": {"reject": True}}, "postpone": {"c": {"postpone_once": True}},
               "no_effect": {"b": {"no_effect_once": True}}}
    external.fail(f"{prefixes['transient']}/b", times=1)
    ids = {name: hub.submit("batched.flow", {"prefix": p, "script": scripts.get(name, {})}).id
           for name, p in prefixes.items()}
    assert hub.run() == 5
    states = {name: hub.get(i).state for name, i in ids.items()}
    assert states == {"ok": "OK", "transient": "PARTLY_FAILED", "reject": "FAILED", "postpone": "POSTPONED",
                      "no_effect": "PARTLY_FAILED"}, states
    hub.tick(seconds=120)  # the retries and the postponed message, re-driven together: a batch again
    states = {name: hub.get(i).state for name, i in ids.items()}
    assert states == {"ok": "OK", "transient": "OK", "reject": "FAILED", "postpone": "OK", "no_effect": "OK"}
    for name, p in prefixes.items():  # no successful call made twice
        assert external.effects(f"{p}/a") == 1 and external.count(f"{p}/a") == 1
        assert external.count(f"{p}/c", 200) == (0 if name == "reject" else 1)
    assert external.count(f"{prefixes['transient']}/b") == 2  # the failed call, then its retry


def test_a_batch_route_waits_for_a_response_and_splits(hub: LocalHub, external: ExternalSystem) -> None:
    prefix = _prefix()
    waiting = [openhub.submit("batched.wait", {"prefix": prefix, "n": n}, source_system="CRM",
                              correlation_id=f"w-{prefix}-{n}").id for n in range(3)]
    order = hub.submit("batched.order", {"prefix": prefix, "lines": [{"sku": 1}, {"sku": 2}, {"sku": 3}]})
    hub.run()
    assert [hub.get(i).state for i in waiting] == ["WAITING_FOR_RES"] * 3
    assert hub.get(order.id).state == "OK" and external.effects(f"{prefix}/line") == 3
    for n, i in enumerate(waiting):
        openhub.respond(i, {"answer": n})
    hub.run()
    assert [hub.get(i).state for i in waiting] == ["OK"] * 3
    assert [hub.get(i).custom_data["answer"] for i in waiting] == [{"answer": n} for n in range(3)]
    assert external.effects(f"{prefix}/request") == 3 and external.effects(f"{prefix}/answered") == 3


def test_a_message_cancelled_while_its_batch_runs_stops_and_the_others_go_on(hub: LocalHub,
                                                                             external: ExternalSystem) -> None:
    prefixes = [_prefix() for _ in range(3)]
    ids = [hub.submit("batched.flow", {"prefix": p}).id for p in prefixes]
    slow = f"{prefixes[1]}/b"
    external.delay(slow, 1.0)  # the middle message's step b is in flight when the operator cancels it
    runner = threading.Thread(target=hub.run)
    runner.start()
    wait_for(lambda: external.started_events[slow].is_set(), timeout=30, what="the slow call to begin")
    openhub.cancel(ids[1])
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert [hub.get(i).state for i in ids] == ["OK", "CANCEL", "OK"]
    assert external.count(f"{prefixes[1]}/b") == 1 and external.count(f"{prefixes[1]}/c") == 0
    assert all(external.count(f"{p}/{name}") == 1 for p in (prefixes[0], prefixes[2]) for name in "abc")
    assert "cancelled" in _history(ids[1])
