"""The Redis broker: kombu's Redis transport with one client per channel, not one per operation.

kombu's Redis channel builds a new `redis.Redis` for every publish, acknowledgement and receipt
(`conn_or_acquire` → `_create_client`), and redis-py fills a table of a few hundred response
callbacks in each: ~4 clients and ~0.6 ms of CPU per step task in a profile of a worker
(bench/RESULTS.md). A client is only a handle on the channel's connection pool and safe to share,
so the channel keeps one per pool (a new pool after a reconnect gets a new client). The plain Celery
tasks of a worker pay the same cost; this removes it for both. celeryconfig.py selects it for
`redis://` brokers through `broker_transport`, so the broker URL that Flower reads is unchanged.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis

TRANSPORT = f"{__name__}:Transport"


class Channel(redis.Channel):
    """Redis channel that reuses its synchronous client."""

    _shared_client: Any = None

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
