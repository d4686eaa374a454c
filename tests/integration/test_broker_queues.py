"""What the poller asks the broker, on Redis and on the embedded broker (issue 33, break 9): did it lose
the tasks it held (the hub's mark in it is gone), and which chains wait in its queues."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from openhub.celery import dispatch
from tests.support.backends import RedisServer, activate


@pytest.fixture(params=["redis", "embedded"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, RedisServer | None]]:
    """A broker of each kind, the hub of this process publishing to it; yields (kind, its Redis)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    server = RedisServer.start(tmp_path / "redis") if request.param == "redis" else None
    activate(
        {
            "OPENHUB_BROKER_URL": server.url if server else "filesystem://",
            "OPENHUB_VAR_DIR": str(tmp_path / "var"),
            "OPENHUB_DATABASE_URL": f"sqlite:///{tmp_path / 'hub.db'}",
            "OPENHUB_ROUTES": "tests.support.promise_routes",
        }
    )
    try:
        yield request.param, server
    finally:
        activate(before)  # the suite's backend again
        if server is not None:
            server.stop()


def _empty(kind: str, server: RedisServer | None, tmp_path: Path) -> None:
    """The broker loses everything it held: Redis restarts empty, the embedded broker's folder is emptied."""
    if server is not None:
        server.restart()
    else:
        shutil.rmtree(tmp_path / "var" / "broker")
    dispatch.reset_app()  # a new connection: the one before is to the Redis that was


def test_the_mark_is_gone_when_the_broker_lost_its_tasks(broker, tmp_path) -> None:
    from openhub.engine.hub import current

    kind, server = broker
    publisher = current().publisher
    assert publisher.broker_marked() is False  # a new broker
    publisher.mark_broker()
    assert publisher.broker_marked() is True
    _empty(kind, server, tmp_path)
    assert publisher.broker_marked() is False


def test_the_chains_waiting_in_the_broker_are_found_by_message_and_token(broker, tmp_path) -> None:
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    kind, server = broker
    publisher = current().publisher
    flow, batch = get_registry().route("p.flow"), get_registry().route("p.batch")
    chains = [(flow, n, f"token-{n}", 0, None, None) for n in range(1, 4)] + [
        (batch, n, f"batch-{n}", 0, None, None) for n in range(4, 7)
    ]
    assert publisher.publish_many(chains) == set(range(1, 7))
    waiting = publisher.waiting_chains({None})
    assert waiting == {(n, token) for _route, n, token, _start, _trace, _priority in chains}
    assert publisher.waiting_chains({"another-queue"}) == set()
    _empty(kind, server, tmp_path)
    assert publisher.waiting_chains({None}) == set()


def test_a_chain_a_worker_took_and_has_not_acknowledged_is_not_taken_for_lost(broker) -> None:
    """A task a worker prefetched and has not run yet is in no queue but in kombu's `unacked` hash: when the
    mark was gone (a new broker) its chain was published again beside it, and both ran (a batch's step called
    21 times for 20 messages in test_faults' killed-mid-batch test)."""
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    kind, _server = broker
    if kind != "redis":
        pytest.skip("the embedded broker keeps no record of what a worker took")
    publisher = current().publisher
    route = get_registry().route("p.flow")
    chains = [(route, 1, "token-1", 0, None, None), (route, 2, "token-2", 0, None, None)]
    assert publisher.publish_many(chains) == {1, 2}
    with dispatch.celery_app().connection_for_write() as conn:
        taken = conn.default_channel.basic_get("openhub", no_ack=False)  # as a worker's prefetch takes it
        assert taken is not None
        assert publisher.waiting_chains({None}) == {(1, "token-1"), (2, "token-2")}
        taken.ack()
    assert len(publisher.waiting_chains({None}) or ()) == 1  # acknowledged: done with, no longer there


def test_a_queue_too_long_to_read_is_not_read(broker, monkeypatch) -> None:
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    monkeypatch.setattr(dispatch, "LOOK_AT_MOST", 5)
    publisher = current().publisher
    route = get_registry().route("p.flow")
    assert publisher.publish_many([(route, n, f"token-{n}", 0, None, None) for n in range(1, 7)]) == set(range(1, 7))
    assert publisher.waiting_chains({None}) is None  # cannot tell: those chains are published again when due
