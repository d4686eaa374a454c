"""The routes and plain Celery tasks the throughput benchmark compares.

Both make the same three no-op HTTP calls to BENCH_HTTP_URL, one per step/task, with a
pooled client per worker process.
"""

from __future__ import annotations

import os

import httpx

from openhub import Route, StepContext, step

URL = os.environ.get("BENCH_HTTP_URL", "http://127.0.0.1:9")
_client: httpx.Client | None = None


def http_call() -> None:
    """One no-op HTTP call to the local server."""
    global _client
    if _client is None:
        _client = httpx.Client(timeout=10)
    _client.post(URL, content=b"{}").raise_for_status()


@step
def first(ctx: StepContext) -> None:
    """Step 1."""
    http_call()


@step
def second(ctx: StepContext) -> None:
    """Step 2."""
    http_call()


@step
def third(ctx: StepContext) -> None:
    """Step 3."""
    http_call()


routes = [Route("bench.flow", steps=[first, second, third]),
          Route("bench.fused", steps=[first, second, third], fused=True)]
