"""The Redis broker keeps one client per channel and still carries every message, also after a reconnect."""

from __future__ import annotations

import base64
import json
import os
from typing import Iterator

import pytest
import redis
from kombu import Connection

from openhub.celery import dispatch
from openhub.celery.redisbroker import TRANSPORT, Transport
from tests.support.backends import RedisServer, activate

# kombu's Redis list of the default priority (4, Redis's 9 - 4 = 5, in its step 3:
# openhub.celery.dispatch.broker_priority)
QUEUE = "openhub\x06\x163"


@pytest.fixture
def server(tmp_path) -> Iterator[RedisServer]:
    s = RedisServer.start(tmp_path / "redis")
    yield s
    s.stop()


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """Counts the redis.Redis clients constructed."""
    count: list[int] = []
    original = redis.Redis.__init__

    def counting(self, *args, **kwargs):
        count.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return count


def test_a_hundred_messages_cost_a_client_or_two_not_hundreds(server, built) -> None:
    with Connection(server.url, transport=TRANSPORT) as conn:
        queue = conn.SimpleQueue("openhub-test")
        for n in range(100):
            queue.put({"n": n})
        received = []
        for _ in range(100):
            message = queue.get(timeout=5)
            received.append(message.payload["n"])
            message.ack()
        queue.close()
    assert received == list(range(100))
    assert len(built) <= 4, f"{len(built)} redis clients for 100 publishes, receipts and acks"


def test_a_new_pool_after_a_reconnect_gets_a_new_client(server) -> None:
    with Connection(server.url, transport=TRANSPORT) as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        channel._disconnect_pools()
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()


def test_the_hub_uses_it_for_a_redis_broker_and_leaves_the_url_alone(server, tmp_path) -> None:
    before = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    activate(
        {
            "OPENHUB_BROKER_URL": server.url,
            "OPENHUB_DATABASE_URL": f"sqlite:///{tmp_path / 'hub.db'}",
            "OPENHUB_VAR_DIR": str(tmp_path / "var"),
        }
    )
    try:
        app = dispatch.celery_app()
        assert app.conf.broker_url == server.url  # what Flower reads to show the broker
        with app.connection_for_write() as conn:
            assert isinstance(conn.transport, Transport)
    finally:
        activate(before)  # the suite's backend again


def test_a_dead_processs_deliveries_go_back_to_the_queue_at_once(server) -> None:
    from openhub.store.workers import current_id

    with Connection(server.url, transport=TRANSPORT) as holder, Connection(server.url, transport=TRANSPORT) as other:
        queue = holder.SimpleQueue("openhub-orphans")
        queue.put({"n": 1})
        taken = queue.get(timeout=5)  # taken and not acknowledged, as by a worker killed before it ran the task
        owners = holder.default_channel.client.hgetall("unacked.owners")
        assert [v.decode() for v in owners.values()] == [current_id()]

        assert other.default_channel.restore_orphans({"some-other-process"}) == 0  # a live holder keeps it
        assert other.default_channel.restore_orphans({current_id()}) == 1
        again = other.SimpleQueue("openhub-orphans").get(timeout=5)
        assert again.payload == taken.payload == {"n": 1}
        again.ack()
        assert not other.default_channel.client.hgetall("unacked.owners")
        assert not other.default_channel.client.hgetall("unacked")


def test_an_acknowledged_delivery_has_no_holder(server) -> None:
    with Connection(server.url, transport=TRANSPORT) as conn:
        queue = conn.SimpleQueue("openhub-acked")
        queue.put({"n": 1})
        queue.get(timeout=5).ack()
        assert not conn.default_channel.client.hgetall("unacked.owners")


def test_more_acknowledgements_at_once_than_the_pool_has_connections_wait_for_one(server) -> None:
    # A gevent or threads worker acknowledges each step's task from the step's own greenlet or thread,
    # all through the consumer's channel. With kombu's plain pool the eleventh at once raised
    # MaxConnectionsError, which the consumer takes for a lost broker (bench/RESULTS.md, issue 21).
    from concurrent.futures import ThreadPoolExecutor

    at_once = 40
    with Connection(server.url, transport=TRANSPORT) as conn:
        channel = conn.default_channel
        assert channel.max_connections < at_once
        queue = conn.SimpleQueue("openhub-acks")
        for n in range(at_once):
            queue.put({"n": n})
        taken = [queue.get(timeout=5) for _ in range(at_once)]
        # Redis holds every write for a second, so each acknowledgement keeps its connection that long.
        server.client().execute_command("CLIENT", "PAUSE", "1000", "WRITE")
        with ThreadPoolExecutor(at_once) as pool:
            failures = [f.exception() for f in [pool.submit(m.ack) for m in taken]]
        assert failures == [None] * at_once
        assert not channel.client.hgetall("unacked")
        queue.close()


def test_chains_published_together_go_out_in_one_round_trip_each_whole(server, tmp_path, monkeypatch) -> None:
    activate(
        {
            "OPENHUB_BROKER_URL": server.url,
            "OPENHUB_ROUTES": "tests.support.promise_routes",
            "OPENHUB_VAR_DIR": str(tmp_path / "var"),
        }
    )
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    route = get_registry().route("p.flow")
    current().publisher.publish_many([(route, 0, "warm-up", 0, None, None)])  # connects, declares the queue
    client = server.client()
    client.delete(QUEUE)
    sends: list[int] = []
    original = redis.connection.Connection.send_packed_command

    def counting(self, *args, **kwargs):
        sends.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    publisher = current().publisher
    assert publisher.publish_many([(route, n, f"token-{n}", 0, None, None) for n in range(1, 51)]) == set(range(1, 51))
    assert len(sends) <= 2, f"{len(sends)} round trips to Redis for 50 chains"
    monkeypatch.undo()
    tasks = [json.loads(raw) for raw in client.lrange(QUEUE, 0, -1)]
    assert len(tasks) == 50
    for task in tasks:  # the first step's task, carrying the second step's task as the rest of its chain
        (message_id, token), _kwargs, embed = json.loads(base64.b64decode(task["body"]))
        assert task["headers"]["task"] == dispatch.task_name(route, route.steps[0]) and token == f"token-{message_id}"
        assert [sig["task"] for sig in embed["chain"]] == [dispatch.task_name(route, route.steps[1])]
        assert embed["chain"][0]["args"] == [message_id, token]
        # What Flower lists as the arguments, the first task's and the next one's when a worker sends it
        assert task["headers"]["argsrepr"] == embed["chain"][0]["options"]["argsrepr"] == repr((message_id, token))
        assert [e["task"] for e in embed["errbacks"]] == [dispatch.CHAIN_FAILED_TASK]


@pytest.mark.parametrize("asked", ["", "1"], ids=["default", "OPENHUB_TASK_SENT_EVENTS=1"])
def test_a_published_task_sends_a_task_sent_event_only_when_asked(server, tmp_path, asked) -> None:
    activate(
        {
            "OPENHUB_BROKER_URL": server.url,
            "OPENHUB_ROUTES": "tests.support.promise_routes",
            "OPENHUB_VAR_DIR": str(tmp_path / "var"),
            "OPENHUB_TASK_SENT_EVENTS": asked,
        }
    )
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    route = get_registry().route("p.flow")
    client = server.client()
    listener = client.pubsub()  # Celery's events travel over Redis pub/sub (a fanout exchange), as Flower hears them
    listener.psubscribe("*celeryev*")
    assert listener.get_message(timeout=5)["type"] == "psubscribe"
    publisher = current().publisher
    assert publisher.publish_many([(route, n, f"token-{n}", 0, None, None) for n in range(1, 21)]) == set(range(1, 21))
    client.publish("/0.celeryev/end-of-test", "end")  # after every event the publish sent, on one Redis
    heard: list[bytes] = []
    while (message := listener.get_message(timeout=5)) is not None and message["data"] != b"end":
        heard.append(message["channel"])
    assert message is not None, "the end marker never came"
    assert client.llen(QUEUE) == 20
    assert len(heard) == (20 if asked else 0), heard[:3]


@pytest.mark.parametrize("back", [True, False], ids=["redis-back", "redis-still-away"])
def test_a_channel_closed_after_its_connection_was_collected_does_not_raise(server, back) -> None:
    """Issue 33, break 8: when Redis goes away, Celery collects the consumer's connection (the transport
    forgets its client) and closes it afterwards; a channel whose first close was cut short (by the read of
    its outstanding BRPOP) is closed then, and putting back the deliveries it holds rebuilt its pool from the
    forgotten client: AttributeError, "Unrecoverable error", the worker exits. Now the channel keeps where its
    Redis is: the deliveries go back when Redis is there, and a Redis still away is a connection error."""
    with Connection(server.url, transport=TRANSPORT) as conn:
        queue = conn.SimpleQueue("openhub-collected")
        queue.put({"n": 1})
        queue.get(timeout=5)  # held, not acknowledged, when the broker goes
        channel = conn.default_channel
        channel._disconnect_pools()  # the connections it had are gone with the server
        if not back:
            server.stop()
        conn.transport.client = None  # what kombu's Connection.collect does to the transport
        if back:
            channel.close()
            assert server.client().llen("openhub-collected") == 1  # handed back to its queue
        else:
            with pytest.raises(conn.connection_errors):
                channel.close()
