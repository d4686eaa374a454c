"""Store bytes per finished message, by table, live rows against churn (issue 10: <= 1 KB).

    PYTHONPATH=. .venv/bin/python bench/store.py [--messages 2000] [--route bench.flow]

The 3-step route of bench/flows.py run in this process by `openhub.testing.LocalHub` over a
fresh PostgreSQL database (submit_many in batches of 500, each batch carried to its end). Then,
per table of what a message leaves behind (messages, ext_calls, transitions): its size per
message right after the run (bench/peers.py's store column counts every table, its warm-up
included, right after a run with two workers), the live rows' bytes
(`pgstattuple`), and every index's size; then the same after VACUUM and REINDEX, i.e. without the
dead rows and index entries that updates of indexed columns leave until autovacuum recycles them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402

from bench.throughput import noop_server  # noqa: E402
from tests.support.backends import postgres_database  # noqa: E402

TABLES = ("messages", "ext_calls", "transitions")


def report(conn: sqlalchemy.Connection, n: int, title: str) -> None:
    print(f"\n{title}\n| table | B/msg | live rows/msg | live row B/msg | dead B/msg | indexes B/msg |")
    print("|---|---|---|---|---|---|")
    total = 0
    for table in TABLES:
        size = conn.exec_driver_sql(f"SELECT pg_total_relation_size('{table}')").scalar_one()
        heap = conn.exec_driver_sql(f"SELECT tuple_count, tuple_len, dead_tuple_len FROM pgstattuple('{table}')").one()
        indexes = conn.exec_driver_sql(
            f"SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            f"WHERE indrelid = '{table}'::regclass ORDER BY 2 DESC"
        ).all()
        total += size
        print(
            f"| {table} | {size / n:.0f} | {heap.tuple_count / n:.1f} | {heap.tuple_len / n:.0f} | "
            f"{heap.dead_tuple_len / n:.0f} | " + ", ".join(f"{name} {b / n:.0f}" for name, b in indexes) + " |"
        )
    print(f"| all three | **{total / n:.0f}** | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--route", default="bench.flow")
    args = parser.parse_args()
    port, server = noop_server()
    from openhub.testing import LocalHub

    try:
        with (
            postgres_database("openhub_bench_store") as url,
            LocalHub("bench.flows", OPENHUB_DATABASE_URL=url, BENCH_HTTP_URL=f"http://127.0.0.1:{port}/") as hub,
        ):
            import openhub

            for start in range(0, args.messages, 500):
                openhub.submit_many(
                    [
                        {"route": args.route, "payload": {"i": i}, "source_system": "BENCH", "correlation_id": f"m-{i}"}
                        for i in range(start, min(start + 500, args.messages))
                    ]
                )
                hub.run()
            admin = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pgstattuple")
                report(conn, args.messages, f"Right after {args.messages} messages of {args.route}:")
                for table in TABLES:
                    conn.exec_driver_sql(f"VACUUM {table}")
                    conn.exec_driver_sql(f"REINDEX TABLE {table}")
                report(conn, args.messages, "After VACUUM and REINDEX (no churn):")
            admin.dispose()
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
