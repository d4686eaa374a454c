"""The engine alone: what a message costs the store, without Celery (issue 10).

    PYTHONPATH=. .venv/bin/python bench/engine.py [--messages 400] [--runs 5] [--route bench.flow]

The 3-step route of bench/flows.py (one POST per step to a local keep-alive no-op server) run
in this process by `openhub.testing.LocalHub` over a fresh PostgreSQL database: submit_many in
one batch, then every chain to its end, step by step as a worker runs them. Per run: messages/s,
CPU ms per message of this process (submit, engine, HTTP client) and of the database's
backends, and the SQL statements and commits per message (SQLAlchemy events; the submit's
included). With no broker and no worker in the way it shows the engine's own cost far more
steadily than bench/peers.py: compare two checkouts by running it from each, alternately.

Steadier still, whatever else the machine runs: instructions per message under callgrind, the
difference of two sizes divided by the 100 messages between them (the noop server is a child
process with its own output file; take the larger count of each run):

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p .venv/bin/python bench/engine.py --runs 1 --messages 60
    (the same with --messages 160)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402

from bench.peers import tree_cpu_ms  # noqa: E402
from bench.throughput import noop_server  # noqa: E402
from tests.support.backends import postgres_database  # noqa: E402

WARMUP = 100


def one_run(route: str, n: int, http_port: int) -> dict[str, float]:
    from openhub.testing import LocalHub

    with (
        postgres_database("openhub_bench_engine") as url,
        LocalHub("bench.flows", OPENHUB_DATABASE_URL=url, BENCH_HTTP_URL=f"http://127.0.0.1:{http_port}/") as hub,
    ):
        import openhub
        from tests.support.process_store import get_engine

        def carry(k: int, tag: str) -> None:
            openhub.submit_many(
                [
                    {"route": route, "payload": {"i": i}, "source_system": "BENCH", "correlation_id": f"{tag}-{i}"}
                    for i in range(k)
                ]
            )
            hub.run()

        carry(WARMUP, "warm-up")
        admin = sqlalchemy.create_engine(url.rsplit("/", 1)[0] + "/postgres", poolclass=sqlalchemy.pool.NullPool)

        def backends() -> list[int]:
            with admin.connect() as conn:
                return [
                    pid
                    for (pid,) in conn.exec_driver_sql(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s", (url.rsplit("/", 1)[1],)
                    )
                ]

        counted = {"statements": 0, "commits": 0}

        def statement(*_args: object) -> None:
            counted["statements"] += 1

        def commit(_conn: object) -> None:
            counted["commits"] += 1

        sqlalchemy.event.listen(get_engine(), "before_cursor_execute", statement)
        sqlalchemy.event.listen(get_engine(), "commit", commit)
        pids = backends()
        pg, cpu, wall = tree_cpu_ms(pids), time.process_time(), time.perf_counter()
        carry(n, "measured")
        wall, cpu, pg = time.perf_counter() - wall, time.process_time() - cpu, tree_cpu_ms(pids) - pg
        sqlalchemy.event.remove(get_engine(), "before_cursor_execute", statement)
        sqlalchemy.event.remove(get_engine(), "commit", commit)
        admin.dispose()
        return {
            "rate": n / wall,
            "cpu_ms": cpu * 1000 / n,
            "pg_ms": pg / n,
            "statements": counted["statements"] / n,
            "commits": counted["commits"] / n,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--route",
        default="bench.flow",
        help="bench.flow (chain mode), bench.fused or bench.published (a topic: three receivers of bench.flow's steps)",
    )
    args = parser.parse_args()
    http_port, server = noop_server()
    runs = []
    try:
        for k in range(args.runs):
            runs.append(one_run(args.route, args.messages, http_port))
            print(f"run {k + 1} " + " ".join(f"{name}={value:.2f}" for name, value in runs[-1].items()), flush=True)
    finally:
        server.terminate()
    print(f"\n{args.route}, {args.messages} messages per run, {args.runs} runs; median (min-max)")
    for name in runs[0]:
        values = [r[name] for r in runs]
        print(f"  {name}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
