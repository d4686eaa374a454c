"""The Redis broker: kombu's Redis transport with one client per channel, and deliveries that name
the worker process holding them.

kombu's Redis channel builds a new `redis.Redis` for every publish, acknowledgement and receipt
(`conn_or_acquire` → `_create_client`), and redis-py fills a table of a few hundred response
callbacks in each: ~4 clients and ~0.6 ms of CPU per step task in a profile of a worker
(bench/RESULTS.md). A client is only a handle on the channel's connection pool and safe to share,
so the channel keeps one per pool (a new pool after a reconnect gets a new client). The plain Celery
tasks of a worker pay the same cost; this removes it for both. celeryconfig.py selects it for
`redis://` brokers through `broker_transport`, so the broker URL that Flower reads is unchanged.

kombu keeps each unacknowledged delivery in the `unacked` hash and puts it back on its queue only
after the visibility timeout (an hour here), whoever held it. A worker killed with a task taken and
not yet started (its step lease not yet written) left that message to the hub's lease grace. Here
each delivery also names the process that took it (`openhub.store.workers.current_id`, whose heartbeat
the hub keeps), and the poller hands the deliveries of processes witnessed dead back to their
queues at once (`Channel.restore_orphans`). A delivery handed back twice is harmless: the step's
fencing token and lease let only one run act.

kombu gives each channel a redis-py `ConnectionPool` of `max_connections` (10), which raises
`MaxConnectionsError` when an eleventh caller wants a connection at once. With one step per
process (prefork) that never happens; on the gevent or threads pool every step acknowledges its
task through the consumer's channel, and under load more than 10 acknowledgements wait on Redis
together: the consumer took the error for a lost broker, reconnected and put all its
unacknowledged deliveries back (421 at once at `-P gevent -c 500` in bench/peers.py, and a
message whose next step was lost on the way waited for the lease grace). Here a caller waits for a
free connection instead (`BlockingConnectionPool`).

The hub keeps a mark in Redis (`put_mark`), a key that goes when the queues go (a restart without
persistence, FLUSHALL, a failover to an empty replica) and stays when they stay; the poller looks at
it every tick and, when it is gone, looks in the queues (`waiting_messages`) for the chains the store
says are in them, to publish again at once those that are not (openhub.engine.poller). Keep Redis's
`maxmemory-policy` at `noeviction` (Celery asks the same): an evicted mark only costs a look.

A channel keeps its own copy of where its Redis is, taken when it opens: kombu reads it from the
transport's client, which Celery drops before the last close of a channel when Redis restarts, and
that close (putting back the deliveries the channel held) killed the worker (issue 33).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Collection

from kombu.transport import redis, virtual
from kombu.utils.json import dumps, loads

from openhub.store.workers import current_id

TRANSPORT = f"{__name__}:Transport"
POOL_WAIT = 60  # seconds a caller waits for one of the channel's connections before it fails
MARK = "openhub.mark"  # a key the hub keeps in the broker: gone, the broker lost its queues (openhub.engine.poller)


class QoS(redis.QoS):
    """kombu's Redis acknowledgement emulation, with the holder of each delivery in `owners_key`."""

    @property
    def owners_key(self) -> str:
        return f"{self.channel.unacked_key}.owners"

    def append(self, message: Any, delivery_tag: str) -> None:
        # kombu's own append, with the holder written in the same round trip.
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}).hset(
                self.unacked_key, delivery_tag, dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
            ).hset(self.owners_key, delivery_tag, current_id()).execute()
        virtual.QoS.append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        # Acknowledged, rejected or restored: the delivery has no holder any more.
        return super()._remove_from_indices(delivery_tag, pipe).hdel(self.owners_key, delivery_tag)


class Channel(redis.Channel):
    """Redis channel that reuses its synchronous client, knows who holds each delivery, and keeps where
    its Redis is."""

    QoS = QoS
    _shared_client: Any = None
    _params: dict[bool, dict[str, Any]] | None = None  # `_connparams`, synchronous and not, once opened

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._params = {False: super()._connparams(), True: super()._connparams(asynchronous=True)}

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        # kombu reads them from the transport's client whenever it builds a pool, and the close of a
        # channel holding deliveries builds one to put them back. When Redis goes away, Celery collects
        # the consumer's connection (the transport forgets its client) and closes it afterwards: a channel
        # whose first close was cut short (by the read of its outstanding BRPOP) is closed then, and the
        # pool it built raised AttributeError: "Unrecoverable error", the worker exited (issue 33). Kept
        # from when the channel opened, they reach its Redis without the transport's client: the
        # deliveries go back if Redis is there again, and a Redis still away is a connection error,
        # which Celery rides out by reconnecting.
        if self._params is None:  # kombu's own __init__ (its first pool, and the ping)
            return super()._connparams(asynchronous=asynchronous)
        return self._params[asynchronous]

    def restore_orphans(self, dead: Collection[str]) -> int:
        """Put the deliveries held by the `dead` worker processes back on their queues; how many."""
        if not dead:
            return 0
        qos = self.qos
        owners = self.client.hgetall(qos.owners_key)
        tags = [tag for tag, owner in owners.items() if owner.decode() in dead]
        for tag in tags:
            qos.restore_by_tag(tag.decode(), self.client)
        return len(tags)

    def has_mark(self) -> bool:
        """Whether the mark the hub keeps in this Redis is there (gone with the queues: a restart without
        the data, a flush)."""
        return bool(self.client.exists(MARK))

    def put_mark(self) -> None:
        """Put the hub's mark (when it was put, for people looking)."""
        self.client.set(MARK, datetime.now(timezone.utc).isoformat())

    def waiting_messages(self, queues: Collection[str], most: int) -> list[dict[str, Any]] | None:
        """The task messages waiting in `queues` (at every priority), and those a worker took and has not
        acknowledged yet (kombu's `unacked` hash, of any queue): a task a worker prefetched is not lost, and
        a chain published again beside it ran twice when the mark was gone (a new broker: test_faults'
        killed-mid-batch test called a batch's step 21 times for 20 messages). A dead worker's are put back
        in their queue by the repair of prefetched tasks. None when there are more than `most`."""
        keys = [self._q_for_pri(queue, priority) for queue in queues for priority in self.priority_steps]
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.llen(key)
            pipe.hlen(self.unacked_key)
            if sum(pipe.execute()) > most:
                return None
            for key in keys:
                pipe.lrange(key, 0, most)
            pipe.hvals(self.unacked_key)
            *waiting, taken = pipe.execute()
        return [loads(raw) for entries in waiting for raw in entries] + [
            loads(raw)[0] for raw in taken
        ]  # each held as [message, exchange, routing key]

    def _get_pool(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the event loop's own connection for receiving (BRPOP): one caller
            return super()._get_pool(asynchronous=True)
        params = self._connparams()
        self.keyprefix_fanout = self.keyprefix_fanout.format(db=params["db"])
        return redis.redis.BlockingConnectionPool(timeout=POOL_WAIT, **params)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._shared_client
        if client is None or client.connection_pool is not pool:
            client = self._shared_client = super()._create_client()
        return client


class Transport(redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel
