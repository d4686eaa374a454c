"""What the poller asks the broker, on Redis and on the embedded broker (issue 33, break 9): did it lose
the tasks it held (the hub's mark in it is gone), and which chains wait in its queues."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from openhub import dispatch
from tests.support.backends import RedisServer, activate


@pytest.fixture(params=["redis", "embedded"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, RedisServer | None]]:
    """A broker of each kind, the hub of this process publishing to it; yields (kind, its Redis)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    server = RedisServer.start(tmp_path / "redis") if request.param == "redis" else None
    activate({"OPENHUB_BROKER_URL": server.url if server else "filesystem://",
              "OPENHUB_VAR_DIR": str(tmp_path / "var"), "OPENHUB_DATABASE_URL": f"sqlite:///{tmp_path / 'hub.db'}",
              "OPENHUB_ROUTES": "tests.support.promise_routes"})
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


def test_the_mark_is_gone_when_the_broker_lost_its_tasks(broker, tmp_path) -> None:  # noqa: ANN001
    from openhub.hub import current

    kind, server = broker
    publisher = current().publisher
    assert publisher.broker_marked() is False  # a new broker
    publisher.mark_broker()
    assert publisher.broker_marked() is True
    _empty(kind, server, tmp_path)
    assert publisher.broker_marked() is False


def test_the_chains_waiting_in_the_broker_are_found_by_message_and_token(broker, tmp_path) -> None:  # noqa: ANN001
    from openhub.hub import current
    from openhub.registry import get_registry

    kind, server = broker
    publisher = current().publisher
    flow, batch = get_registry().route("p.flow"), get_registry().route("p.batch")
    chains = [(flow, n, f"token-{n}", 0, None) for n in range(1, 4)] + [(batch, n, f"batch-{n}", 0, None)
                                                                        for n in range(4, 7)]
    assert publisher.publish_many(chains) == set(range(1, 7))
    waiting = publisher.waiting_chains({None})
    assert waiting == {(n, token) for _route, n, token, _start, _trace in chains}
    assert publisher.waiting_chains({"another-queue"}) == set()
    _empty(kind, server, tmp_path)
    assert publisher.waiting_chains({None}) == set()


def test_a_queue_too_long_to_read_is_not_read(broker, monkeypatch) -> None:  # noqa: ANN001
    from openhub.hub import current
    from openhub.registry import get_registry

    monkeypatch.setattr(dispatch, "LOOK_AT_MOST", 5)
    publisher = current().publisher
    route = get_registry().route("p.flow")
    assert publisher.publish_many([(route, n, f"token-{n}", 0, None) for n in range(1, 7)]) == set(range(1, 7))
    assert publisher.waiting_chains({None}) is None  # cannot tell: those chains are published again when due
