"""The poller: two ticks at once never dispatch a message twice; its query reads the partial index."""

from __future__ import annotations

import re
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from openhub.engine.due import _due_query
from openhub.engine.hub import current
from openhub.engine.intake import insert_new_many, prepare
from openhub.engine.poller import tick
from openhub.store.db import utcnow
from openhub.store.schema import messages, transitions
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for


def _due_messages(prefix: str, n: int, now: datetime | None = None) -> list[int]:
    """`n` PARTLY_FAILED messages due a second before `now` (default: the current time)."""
    now = now or utcnow()
    rows = [
        prepare("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"due-{uuid.uuid4().hex}")
        for _ in range(n)
    ]
    with transaction() as conn:
        ids = insert_new_many(conn, rows)
        conn.execute(
            update(messages)
            .where(messages.c.id.in_(ids))
            .values(state="PARTLY_FAILED", failed_count=1, due_at=now - timedelta(seconds=1))
        )
    return ids  # type: ignore[return-value]


def test_two_pollers_never_dispatch_one_message_twice(hub, prefix) -> None:
    # Due only at the two ticks' time, an hour ahead: the worker's beat polls the same store every
    # 0.3 s on the real clock, and a third poller that took the rows first (they are skipped while it
    # holds them) and had not committed when the history was read left the two under test nothing.
    now = utcnow() + timedelta(hours=1)
    ids = _due_messages(prefix, 60, now)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            barrier.wait()
            tick(current(), now)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with transaction() as conn:
        redriven = Counter(
            conn.execute(
                select(transitions.c.message_id).where(
                    transitions.c.message_id.in_(ids), transitions.c.event == "redriven"
                )
            ).scalars()
        )
    assert set(redriven) == set(ids) and set(redriven.values()) == {1}
    assert all(wait_final(i, timeout=120).state == "OK" for i in ids)


def test_idle_poller_ticks_log_nothing_at_info(hub, worker, prefix) -> None:
    wait_for(lambda: "Sending due task openhub-poll" in worker.log())  # beat's first send stays INFO
    start = len(worker.log())
    (message_id,) = _due_messages(prefix, 1, utcnow() + timedelta(seconds=2))  # idle ticks, then one that acts
    assert wait_final(message_id).state == "OK"
    window = worker.log()[start:]
    assert re.search(r"poller tick: re-drove [1-9]", window), window[-3000:]  # a tick that did something says so
    # ...and Celery's three lines per tick (beat sends it, the worker receives it, it succeeded) are DEBUG
    assert "openhub.poll[" not in window and "Sending due task openhub-poll" not in window, window[-3000:]


def test_poller_query_reads_only_the_partial_index(backend) -> None:
    backend.activate()
    with transaction() as conn:
        compiled = _due_query(utcnow(), {"test.held"}, None).compile(conn, compile_kwargs={"literal_binds": True})
        if conn.dialect.name == "sqlite":
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # a tiny table would be seq-scanned anyway
            plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {compiled}"))
    assert "ix_messages_due" in plan, plan


@pytest.mark.parametrize("state", ["IN_QUEUE", "PROCESSING"])
def test_a_lost_chain_is_published_again_without_a_failure(hub, prefix, external, state) -> None:
    (message_id,) = _due_messages(prefix, 1)
    with transaction() as conn:  # as if the chain was lost in the broker (or still waits in a backlog)
        conn.execute(
            update(messages)
            .where(messages.c.id == message_id)
            .values(
                state=state, failed_count=0, attempt_id="lost", step_run=None, due_at=utcnow() - timedelta(seconds=1)
            )
        )
    done = wait_final(message_id)
    assert done.state == "OK" and done.failed_count == 0
    with transaction() as conn:
        events = list(conn.execute(select(transitions.c.event).where(transitions.c.message_id == message_id)).scalars())
    assert "chain_lost" in events


def test_a_step_whose_worker_is_gone_is_retried_without_a_failure(hub, prefix, external) -> None:
    (message_id,) = _due_messages(prefix, 1)
    with transaction() as conn:  # a step lease held by a worker that left no heartbeat, on its last try
        conn.execute(
            update(messages)
            .where(messages.c.id == message_id)
            .values(
                state="PROCESSING",
                failed_count=3,
                attempt_id="lost",
                step_run="gone",
                worker="unknown-worker",
                due_at=utcnow() - timedelta(seconds=1),
            )
        )
    done = wait_final(message_id)
    assert done.state == "OK" and done.failed_count == 3  # the hub's fault is not one of the message's
    assert "its worker is gone" in done.failed_error and done.error_code == "WORKER_LOST"
