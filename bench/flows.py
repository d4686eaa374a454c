"""The routes and plain Celery tasks the throughput benchmark compares.

Both make the same three HTTP calls to BENCH_HTTP_URL, one per step/task, to the path
`<step>/<message key>` (bench/slow_server.py counts each), with one pooled client per worker
process whose pool holds as many connections as the process has steps in flight (gevent: hundreds).
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta

import httpx

from openhub import Route, StepContext, Topic, step
from openhub.outbound.http import HttpCall, held_client, pooled_client

URL = os.environ.get("BENCH_HTTP_URL", "http://127.0.0.1:9")
# httpcore's pool looks at every connection it holds for every request it assigns: with 400 calls in
# flight through one client that scan was half of a gevent worker's CPU (bench/RESULTS.md). Calls
# go round the process's BENCH_HTTP_CLIENTS clients (bench/peers.py: one per 16 of the worker's
# concurrency), so each pool holds a few dozen connections. BENCH_HTTP_CLIENT (bench/peers.py
# --http-client): `sharded` those clients, `pooled` the product's `pooled_client()`, `httpcall` the
# route's steps written on the product's HttpCall (the plain chain and DBOS, which have no step
# context, on `held_client()`, the client HttpCall holds per call).
CLIENTS = int(os.environ.get("BENCH_HTTP_CLIENTS", "1"))
CLIENT = os.environ.get("BENCH_HTTP_CLIENT", "sharded")
_clients: list[httpx.Client] | None = None
_turn = itertools.count()
CALL = HttpCall(timeout=30)


# httpx keeps 20 idle connections by default: past that, a gevent worker with hundreds of calls in
# flight would open a new TCP connection for most calls.
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=2000)


def http_call(key: str = "", ctx: StepContext | None = None) -> None:
    """One HTTP call to the local server, at the path `key` (say "first/42"), for the step of `ctx` if given."""
    global _clients
    if CLIENT == "httpcall":
        if ctx is not None:
            CALL.post(ctx, URL + key, content=b"{}")  # a 4xx or 5xx raises
            return
        with held_client() as client:
            client.post(URL + key, content=b"{}").raise_for_status()
        return
    if CLIENT == "pooled":
        pooled_client().post(URL + key, content=b"{}").raise_for_status()
        return
    clients = _clients
    if clients is None:  # DBOS runs steps in threads: a list is bound only once it is whole
        clients = _clients = [httpx.Client(timeout=30, limits=LIMITS) for _ in range(CLIENTS)]
    clients[next(_turn) % CLIENTS].post(URL + key, content=b"{}").raise_for_status()


@step
def first(ctx: StepContext) -> None:
    """Step 1."""
    http_call(f"first/{ctx.message.id}", ctx)


@step
def second(ctx: StepContext) -> None:
    """Step 2."""
    http_call(f"second/{ctx.message.id}", ctx)


@step
def third(ctx: StepContext) -> None:
    """Step 3."""
    http_call(f"third/{ctx.message.id}", ctx)


# A batch task may run its messages' steps one after another (prefork): its time limit is the route's
# once per message, which must stay under the broker's visibility timeout (1 h): 100 x 3 x 10 s.
BATCH, BATCH_STEP_TIMEOUT = 100, timedelta(seconds=10)

routes = [
    Route("bench.flow", steps=[first, second, third]),
    Route("bench.fused", steps=[first, second, third], fused=True),
    Route(
        "bench.batch",
        batch=BATCH,
        steps=[step(s.fn, key=s.key, timeout=BATCH_STEP_TIMEOUT) for s in (first, second, third)],
    ),
    # Fan-out (issue 37): one message of the topic is three messages, each bench.flow's three steps.
    Topic("bench.published"),
    *(Route(f"benchsub.{n}", steps=[first, second, third], subscribes="bench.published") for n in "abc"),
]
