"""Throughput of openhub against a plain Celery chain, and the poller's tick with 1M final rows.

    .venv/bin/python bench/throughput.py [--messages 2000] [--concurrency 2] [--big 1000000]

Runs on Redis (a private redis-server) + PostgreSQL (a fresh database on 127.0.0.1:5432), with
one `celery -A tasks worker` (prefork, same settings for both variants) and a local no-op HTTP
server. Prints messages/s for both, their ratio, and the tick time. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.wire import read_message  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402


def serve_noop(port: int) -> None:
    """A minimal keep-alive HTTP server answering 200 {} to everything (runs in its own process)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_message(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def noop_server() -> tuple[int, multiprocessing.Process]:
    """`serve_noop` on a free loopback port, started in a daemon process of its own: (port, process)."""
    from tests.support.backends import free_port

    port = free_port()
    server = multiprocessing.Process(target=serve_noop, args=(port,), daemon=True)
    server.start()
    return port, server


def run_plain(n: int, counter) -> float:
    from celery import chain

    from openhub.celery.dispatch import celery_app

    app = celery_app()
    counter.delete("bench:plain:done")
    started = time.perf_counter()
    for i in range(n):
        chain(
            app.signature("bench.plain.first", args=(i,), immutable=True),
            app.signature("bench.plain.second", args=(i,), immutable=True),
            app.signature("bench.plain.third", args=(i,), immutable=True),
        ).apply_async()
    wait_for(lambda: int(counter.get("bench:plain:done") or 0) >= n, 600, "plain chains")
    return n / (time.perf_counter() - started)


def run_openhub(n: int) -> float:
    from sqlalchemy import func, select

    import openhub
    from openhub.store.schema import messages
    from tests.support.process_store import transaction

    started = time.perf_counter()
    first_id = None
    for start in range(0, n, 100):
        views = openhub.submit_many(
            [
                {
                    "route": "bench.flow",
                    "payload": {"i": i},
                    "source_system": "BENCH",
                    "correlation_id": f"b-{started}-{i}",
                }
                for i in range(start, min(n, start + 100))
            ]
        )
        first_id = first_id or views[0].id

    def all_ok() -> bool:  # this run's messages only, not the warm-up's
        with transaction() as conn:
            return (
                conn.execute(select(func.count()).where(messages.c.state == "OK", messages.c.id >= first_id)).scalar()
                >= n
            )

    wait_for(all_ok, 600, "openhub messages")
    return n / (time.perf_counter() - started)


def fill_final(url: str, rows: int) -> None:
    """Insert `rows` final (OK) messages with PostgreSQL's generate_series."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            INSERT INTO messages (source_system, correlation_id, service, operation, payload, state,
                                  failed_count, attempts, generation, received_at, msg_timestamp, updated_at,
                                  finished_at)
            SELECT 'FILL', 'fill-' || g, 'bench', 'flow', '{{}}', 'OK', 0, 1, 0,
                   now() - interval '1 day', now() - interval '1 day', now(), now()
            FROM generate_series(1, {rows}) AS g""")
        # A few non-final messages, not yet due, as a live hub would have.
        conn.exec_driver_sql("""
            INSERT INTO messages (source_system, correlation_id, service, operation, payload, state,
                                  failed_count, attempts, generation, received_at, msg_timestamp, updated_at,
                                  due_at)
            SELECT 'FILL', 'live-' || g, 'bench', 'flow', '{}', 'PARTLY_FAILED', 1, 1, 0,
                   now(), now(), now(), now() + interval '1 hour'
            FROM generate_series(1, 100) AS g""")
        conn.exec_driver_sql("ANALYZE messages")
    engine.dispose()


def time_ticks(repeat: int = 50) -> tuple[float, float]:
    from openhub.engine.hub import current
    from openhub.engine.poller import tick

    hub = current()
    tick(hub)  # warm the connection pool and caches
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        tick(hub)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), max(samples)


def explain(url: str) -> str:
    import sqlalchemy

    from openhub.engine.poller import _due_query
    from openhub.store.db import utcnow

    engine = sqlalchemy.create_engine(url)
    query = _due_query(utcnow(), set(), None).compile(engine, compile_kwargs={"literal_binds": True})
    with engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {query}"))
    engine.dispose()
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--big", type=int, default=1_000_000, help="final rows for the tick measurement")
    args = parser.parse_args()

    from tests.support.backends import RedisServer, postgres_database

    workdir = Path(tempfile.mkdtemp(prefix="openhub-bench-"))
    http_port, server = noop_server()
    redis_server = RedisServer.start(workdir / "redis")
    try:
        with postgres_database("openhub_bench") as url:
            env = {
                "OPENHUB_DATABASE_URL": url,
                "OPENHUB_BROKER_URL": redis_server.url,
                "OPENHUB_ROUTES": "bench.flows",
                "OPENHUB_VAR_DIR": str(workdir / "var"),
                "BENCH_HTTP_URL": f"http://127.0.0.1:{http_port}/",
                "BENCH_COUNTER_URL": f"redis://127.0.0.1:{redis_server.port}/1",
            }
            from tests.support.backends import activate

            activate({k: v for k, v in env.items() if k.startswith("OPENHUB_")})  # BENCH_*: the workers'
            from openhub.store.migrate import upgrade

            upgrade(url)
            from tests.support.workers import Worker

            worker = Worker(env, workdir, beat=False, concurrency=args.concurrency)
            worker.args += ["--include", "bench.plain_tasks"]
            worker.start()
            try:
                counter = redis.Redis(host="127.0.0.1", port=redis_server.port, db=1)
                run_plain(200, counter)  # warm-up both paths
                run_openhub(200)
                plain = run_plain(args.messages, counter)
                hub = run_openhub(args.messages)
            finally:
                worker.stop()
            print(
                f"messages: {args.messages}, worker concurrency: {args.concurrency} (prefork), {os.cpu_count()} cores"
            )
            print(f"plain Celery chain : {plain:8.1f} chains/s")
            print(f"openhub route      : {hub:8.1f} messages/s")
            print(f"ratio              : {hub / plain:8.2f}")
            small_median, small_max = time_ticks()
            fill_final(url, args.big)
            big_median, big_max = time_ticks()
            rows = args.messages + 400
            print(f"poller tick, {rows} rows     : median {small_median:6.2f} ms, max {small_max:6.2f} ms")
            print(f"poller tick, +{args.big} final rows: median {big_median:6.2f} ms, max {big_max:6.2f} ms")
            print("poller query plan:\n" + explain(url))
    finally:
        redis_server.stop()
        server.terminate()


if __name__ == "__main__":
    main()
