"""A plain Celery chain of three tasks making the same HTTP calls (the baseline)."""

from __future__ import annotations

import os

import redis

from bench.flows import http_call
from openhub.celery.dispatch import celery_app

app = celery_app()
# Blocking: hundreds of gevent steps count at once, and redis-py's plain pool refuses past its size.
_done = redis.Redis(
    connection_pool=redis.BlockingConnectionPool.from_url(
        os.environ.get("BENCH_COUNTER_URL", "redis://127.0.0.1:6379/15"), max_connections=20, timeout=60
    )
)


@app.task(name="bench.plain.first")
def plain_first(i: int) -> None:
    """Task 1."""
    http_call(f"first/{i}")


@app.task(name="bench.plain.second")
def plain_second(i: int) -> None:
    """Task 2."""
    http_call(f"second/{i}")


@app.task(name="bench.plain.third")
def plain_third(i: int) -> None:
    """Task 3: counts the finished chain."""
    http_call(f"third/{i}")
    _done.incr("bench:plain:done")
