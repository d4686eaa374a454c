"""RabbitMQ as the broker (README.md, "Brokers"): the subset of the behaviour suite that exercises the
broker, on the rabbit-pg backend (a private RabbitMQ node and a fresh PostgreSQL database).

Not the whole suite on a third backend (CI's time is at its budget): what the broker changes is how
tasks are published (publisher confirms), queued (durable priority queues), taken and handed back
(late acknowledgement, the connection's close); the engine above it is the one the other backends test.
The slow faults (a worker killed, RabbitMQ restarted, connections cut, consumer_timeout, a refused
publish) are in tests/chaos/test_rabbitmq_faults.py.
"""

from __future__ import annotations

import uuid

import pytest

import openhub
from tests.support.checks import assert_each_step_ok_once
from tests.support.waiting import wait_final

pytestmark = [pytest.mark.parametrize("backend", ["rabbit-pg"], indirect=True), pytest.mark.usefixtures("hub")]


def submit(route: str, prefix: str, **kwargs) -> openhub.MessageView:
    return openhub.submit(
        route, {"prefix": prefix}, source_system="CRM", correlation_id=f"c-{uuid.uuid4().hex}", **kwargs
    )


def test_messages_flow_through_rabbitmq_each_step_called_once(backend, svc, prefix, external) -> None:
    sent = [submit(f"{svc}.flow", f"{prefix}-{n}", priority=n) for n in (0, 4, 9)] + [submit(f"{svc}.flow", prefix)]
    done = [wait_final(m.id) for m in sent]
    assert [m.state for m in done] == ["OK"] * 4, [(m.state, m.failed_error) for m in done]
    assert [m.priority for m in done] == [0, 4, 9, 4]  # the last: the route's default (none), the hub's 4
    assert_each_step_ok_once([m.id for m in sent], ["a", "b", "c"])
    # The queues are durable priority queues.
    listed = backend.rabbit.ctl("list_queues", "-q", "--no-table-headers", "name", "durable", "arguments")
    assert "x-max-priority" in listed and "\ttrue\t" in listed, listed
