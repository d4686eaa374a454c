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
from tests.support.checks import assert_each_step_ok_once
from tests.support.waiting import wait_final, wait_for


@pytest.fixture
def system(monkeypatch: pytest.MonkeyPatch) -> Iterator[ExternalSystem]:
    system = ExternalSystem().start()
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", system.url)
    yield system
    system.stop()


@pytest.fixture
def local(local_store_env: dict[str, str], system: ExternalSystem) -> Iterator[LocalHub]:
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


def test_a_batch_carries_its_messages_step_by_step_each_step_called_once(local: LocalHub,
                                                                        system: ExternalSystem) -> None:
    prefix = _prefix()
    ids = [local.submit("batched.flow", {"prefix": prefix, "n": n}).id for n in range(5)]
    assert len(local.publisher.chains) == 5
    assert local.run() == 5
    assert all(local.get(i).state == "OK" for i in ids)
    for name in "abc":
        assert system.count(f"{prefix}/{name}") == 5 and system.effects(f"{prefix}/{name}") == 5
    # Lockstep: every message's step a ended before any step b began (one task carried them all).
    calls = [c for c in system.calls if c.path.startswith(prefix)]
    last_a = max(c.ended for c in calls if c.path.endswith("/a"))
    assert last_a <= min(c.started for c in calls if c.path.endswith("/b"))


def test_mixed_outcomes_in_one_batch_each_go_their_own_way(local: LocalHub, system: ExternalSystem) -> None:
    prefixes = {name: _prefix() for name in ("ok", "transient", "reject", "postpone", "no_effect")}
    scripts = {"reject": {"b": {"reject": True}}, "postpone": {"c": {"postpone_once": True}},
               "no_effect": {"b": {"no_effect_once": True}}}
    system.fail(f"{prefixes['transient']}/b", times=1)
    ids = {name: local.submit("batched.flow", {"prefix": p, "script": scripts.get(name, {})}).id
           for name, p in prefixes.items()}
    assert local.run() == 5
    states = {name: local.get(i).state for name, i in ids.items()}
    assert states == {"ok": "OK", "transient": "PARTLY_FAILED", "reject": "FAILED", "postpone": "POSTPONED",
                      "no_effect": "PARTLY_FAILED"}, states
    local.tick(seconds=120)  # the retries and the postponed message, re-driven together: a batch again
    states = {name: local.get(i).state for name, i in ids.items()}
    assert states == {"ok": "OK", "transient": "OK", "reject": "FAILED", "postpone": "OK", "no_effect": "OK"}
    for name, p in prefixes.items():  # no successful call made twice
        assert system.effects(f"{p}/a") == 1 and system.count(f"{p}/a") == 1
        assert system.count(f"{p}/c", 200) == (0 if name == "reject" else 1)
    assert system.count(f"{prefixes['transient']}/b") == 2  # the failed call, then its retry


def test_a_batch_route_waits_for_a_response_and_splits(local: LocalHub, system: ExternalSystem) -> None:
    prefix = _prefix()
    waiting = [openhub.submit("batched.wait", {"prefix": prefix, "n": n}, source_system="CRM",
                              correlation_id=f"w-{prefix}-{n}").id for n in range(3)]
    order = local.submit("batched.order", {"prefix": prefix, "lines": [{"sku": 1}, {"sku": 2}, {"sku": 3}]})
    local.run()
    assert [local.get(i).state for i in waiting] == ["WAITING_FOR_RES"] * 3
    assert local.get(order.id).state == "OK" and system.effects(f"{prefix}/line") == 3
    for n, i in enumerate(waiting):
        openhub.respond(i, {"answer": n})
    local.run()
    assert [local.get(i).state for i in waiting] == ["OK"] * 3
    assert [local.get(i).custom_data["answer"] for i in waiting] == [{"answer": n} for n in range(3)]
    assert system.effects(f"{prefix}/request") == 3 and system.effects(f"{prefix}/answered") == 3


def test_a_message_cancelled_while_its_batch_runs_stops_and_the_others_go_on(local: LocalHub,
                                                                             system: ExternalSystem) -> None:
    prefixes = [_prefix() for _ in range(3)]
    ids = [local.submit("batched.flow", {"prefix": p}).id for p in prefixes]
    slow = f"{prefixes[1]}/b"
    system.delay(slow, 1.0)  # the middle message's step b is in flight when the operator cancels it
    runner = threading.Thread(target=local.run)
    runner.start()
    wait_for(lambda: system.started_events[slow].is_set(), timeout=30, what="the slow call to begin")
    openhub.cancel(ids[1])
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert [local.get(i).state for i in ids] == ["OK", "CANCEL", "OK"]
    assert system.count(f"{prefixes[1]}/b") == 1 and system.count(f"{prefixes[1]}/c") == 0
    assert all(system.count(f"{p}/{name}") == 1 for p in (prefixes[0], prefixes[2]) for name in "abc")
    assert "cancelled" in _history(ids[1])


def test_a_worker_runs_batches_on_both_backends(hub, external, prefix) -> None:  # noqa: ANN001
    """The session's real worker: messages submitted together go in one batch task (Flower shows
    `openhub.batched.flow.batch`), each step of each message called once."""
    ids = [v.id for v in openhub.submit_many([{"route": "batched.flow", "payload": {"prefix": prefix},
                                               "source_system": "CRM", "correlation_id": f"{prefix}-{n}"}
                                              for n in range(10)])]
    assert [wait_final(i).state for i in ids] == ["OK"] * 10
    for name in "abc":
        assert external.count(f"{prefix}/{name}") == 10 and external.effects(f"{prefix}/{name}") == 10
    assert_each_step_ok_once(ids, ["a", "b", "c"])
    assert "openhub.batched.flow.batch" in hub.workers[0].log()
