"""Priority end to end (README.md, "Priority"): 0-9, higher = sooner, on every broker the hub supports.

The broker half: a message of priority 9 submitted behind a backlog of 1,000 of priority 0 is taken
before them by a worker started afterwards, on Redis (kombu's priority lists, the other way round:
openhub.celery.dispatch.broker_priority maps) and on RabbitMQ (x-max-priority queues). Each broker is a
backend of its own, thrown away with its backlog. The store half: the poller's due scan re-drives the
higher priorities first.
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, select

import openhub
from openhub.store.schema import messages
from openhub.testing import LocalHub
from tests.support import backends
from tests.support.process_store import transaction
from tests.support.waiting import wait_final
from tests.support.workers import Worker

BACKLOG = 1000


@pytest.mark.parametrize("broker", ["redis-pg", "rabbit-pg"])
def test_a_high_priority_message_overtakes_a_backlog_of_1000(broker, tmp_path, external) -> None:
    prefix = f"/prio-{uuid.uuid4().hex[:8]}"
    before = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    try:
        with backends.backend(broker, tmp_path / broker, {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as own:
            backlog = openhub.submit_many(
                [
                    dict(
                        route="test.held",
                        payload={"prefix": f"{prefix}-low"},
                        source_system="CRM",
                        correlation_id=f"low-{n}",
                        priority=0,
                    )
                    for n in range(BACKLOG)
                ]
            )
            urgent = openhub.submit(
                "test.held", {"prefix": f"{prefix}-high"}, source_system="CRM", correlation_id="high", priority=9
            )
            assert {m.priority for m in backlog} == {0} and urgent.priority == 9
            worker = Worker(own.env, own.workdir, concurrency=1).start()  # every task waits in the broker
            try:
                assert wait_final(urgent.id, timeout=120).state == "OK"
                with transaction() as conn:
                    started = conn.execute(
                        select(func.count())
                        .select_from(messages)
                        .where(messages.c.priority == 0, messages.c.state != "NEW")
                    ).scalar_one()
            finally:
                worker.stop()
            # Prefetch lets the worker hold a task or two before the urgent one reaches the front.
            assert started <= 3, f"{started} of the backlog went first on {broker}"
            assert external.count(f"{prefix}-high/a") == 1
    finally:
        backends.activate(before)  # this process's settings as they were, for the tests after this one


def test_the_pollers_due_scan_redrives_higher_priorities_first(external, monkeypatch) -> None:
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    with LocalHub("tests.support.routes") as hub:
        low = [hub.submit("test.held", {"prefix": "/p"}, priority=p) for p in (1, 5, 0)]
        high = hub.submit("test.held", {"prefix": "/p"}, priority=9)
        hub.lose_broker()  # every chain lost: the poller publishes them again, in its scan's order
        published: list[int] = []
        publish = hub.publisher.publish_many
        monkeypatch.setattr(
            hub.publisher, "publish_many", lambda chains: published.extend(c[1] for c in chains) or publish(chains)
        )
        for _ in range(2):  # the first tick sees the broker's loss, the second re-drives
            hub.tick(seconds=timedelta(minutes=10).total_seconds())
    assert published == [high.id, low[1].id, low[0].id, low[2].id], published
