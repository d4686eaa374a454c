"""The poller's repairs on LocalHub over SQLite and PostgreSQL (issue 33).

- Every step run a dead worker left is seen in one tick, oldest first, however many there are ("also
  read"): it read at most 500 rows in no order, so past that a dead worker's runs waited for their
  leases to run out.
- Chains lost with the broker (restarted empty, flushed) are published again within two poll intervals
  (break 9): they waited for OPENHUB_LEASE_GRACE (300 s). A chain whose task still waits in the broker
  is never published again.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta
from typing import Iterator

import pytest
from sqlalchemy import bindparam, func, select, update

from openhub.engine import engine
from openhub.engine.due import BATCH
from openhub.engine.intake import insert_new_many, prepare
from openhub.engine.poller import repair_lost_runs, tick
from openhub.store.db import utcnow
from openhub.store.schema import messages, transitions
from openhub.store.workers import beat
from openhub.testing import LocalHub
from tests.support import promise_routes as routes
from tests.support.process_store import process_url, transaction

M = messages.c
DEAD_RUNS = BATCH + 40


@pytest.fixture
def hub(local_store_env: dict[str, str]) -> Iterator[LocalHub]:
    # A poll interval long enough that one tick's repair is never cut short by a loaded box.
    with routes.local_hub(OPENHUB_POLL_INTERVAL="300", **local_store_env) as local:
        yield local


def _dead_worker_runs(now: datetime, n: int) -> list[int]:
    """`n` messages mid-step on worker "victim", witnessed dead; their leases run for another hour. They
    were leased in an order of their own (neither id order nor the order the rows were written in), and
    are returned in it, oldest first."""
    rows = [
        prepare("p.flow", {}, source_system="CONFIRMED", correlation_id=f"dead-{uuid.uuid4().hex}") for _ in range(n)
    ]
    with transaction() as conn:
        ids = [i for i in insert_new_many(conn, rows) if i is not None]
        first, leased = now - timedelta(minutes=20), dict(zip(ids, random.Random(33).sample(range(n), n)))
        conn.execute(
            update(messages)
            .where(M.id == bindparam("mid"))
            .values(
                state="PROCESSING",
                step_run=bindparam("run"),
                worker="victim",
                due_at=now + timedelta(hours=1),
                updated_at=bindparam("leased"),
            ),
            [
                {"mid": i, "run": f"1.{uuid.uuid4().hex[:24]}", "leased": first + timedelta(seconds=leased[i])}
                for i in ids
            ],
        )
    beat("victim", "victim-node", process_url(), now=now - timedelta(minutes=1))  # silent for a minute...
    beat("witness", "witness-node", process_url(), broken=True, now=now - timedelta(minutes=2))
    beat("witness", "witness-node", process_url(), now=now)  # ...while another worker went on beating
    return sorted(ids, key=leased.__getitem__)


def _still_held(ids: list[int]) -> list[int]:
    with transaction() as conn:
        return list(conn.execute(select(M.id).where(M.id.in_(ids), M.worker == "victim").order_by(M.id)).scalars())


def test_a_dead_worker_with_more_runs_than_a_page_has_them_all_repaired_in_one_tick(hub: LocalHub) -> None:
    now = utcnow()
    ids = _dead_worker_runs(now, DEAD_RUNS)
    report = tick(hub.hub, now)
    assert _still_held(ids) == []
    assert report.repaired >= DEAD_RUNS
    with transaction() as conn:
        expired = conn.execute(
            select(func.count())
            .select_from(transitions)
            .where(transitions.c.message_id.in_(ids), transitions.c.event == "lease_expired")
        ).scalar_one()
    assert expired == DEAD_RUNS  # each repaired once: +1 failure, due again now


def test_the_repair_takes_the_oldest_runs_first_and_leaves_the_rest_when_its_time_is_spent(hub: LocalHub) -> None:
    now = utcnow()
    ids = _dead_worker_runs(now, DEAD_RUNS)
    assert repair_lost_runs(hub.hub, now, budget=0)[0] == BATCH  # no time: one page, the runs leased first
    assert _still_held(ids) == sorted(ids[BATCH:])
    assert repair_lost_runs(hub.hub, now, budget=0)[0] == DEAD_RUNS - BATCH  # the next tick's
    assert _still_held(ids) == []


# --- chains lost with the broker -------------------------------------------------------------------------

POLL = timedelta(seconds=5)


@pytest.fixture
def lossy(local_store_env: dict[str, str]) -> Iterator[LocalHub]:
    # A lease grace of an hour: anything carried on within seconds was found by another way than it.
    with routes.local_hub(
        OPENHUB_POLL_INTERVAL=str(POLL.total_seconds()), OPENHUB_LEASE_GRACE="3600", **local_store_env
    ) as local:
        yield local


def _history(message_id: int) -> list[str]:
    with transaction() as conn:
        return list(
            conn.execute(
                select(transitions.c.event).where(transitions.c.message_id == message_id).order_by(transitions.c.id)
            ).scalars()
        )


def test_chains_lost_with_the_broker_are_published_again_at_the_next_tick(lossy: LocalHub) -> None:
    between = lossy.submit("p.flow", {}).id  # its first step done, its second step's task in the broker
    route, message_id, token, _start, trace, priority = lossy.publisher.chains.popleft()
    assert engine.run_step(route.name, 0, message_id, token)
    lossy.publisher.chains.append((route, message_id, token, 1, trace, priority))  # as the worker sent it
    queued = [lossy.submit("p.flow", {}).id for _ in range(3)]  # their first tasks in the broker
    lossy.lose_broker()
    after = lossy.submit("p.flow", {})  # published after the restart: in the broker, not lost
    now = utcnow()
    assert tick(lossy.hub, now).redriven == 0  # the mark is gone: the chains the broker had are due at the next tick
    assert tick(lossy.hub, now + POLL).redriven == 4  # not in the broker: published again; `after` is
    assert lossy.get(after.id).state == "NEW" and "chain_lost" not in _history(after.id)
    lossy.run()
    assert {(lossy.get(i).state, lossy.get(i).failed_count) for i in [between, *queued, after.id]} == {("OK", 0)}
    assert routes.calls("first") == routes.calls("second") == 5  # each step called once per message


def test_a_chain_whose_task_waits_in_the_broker_is_never_published_again(lossy: LocalHub) -> None:
    view = lossy.submit("p.flow", {})
    now = utcnow()
    for hours in (2, 5, 24):  # a backlog long past the lease grace
        assert tick(lossy.hub, now + timedelta(hours=hours)).redriven == 0
    assert len(lossy.publisher.chains) == 1 and _history(view.id) == ["accepted"]
    lossy.run()
    assert (lossy.get(view.id).state, lossy.get(view.id).failed_count) == ("OK", 0)
