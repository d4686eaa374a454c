"""Benchmark of the admin overview's refresh (issue 12) at a million messages on PostgreSQL.

    .venv/bin/python bench/overview.py [--messages 1000000] [--live 0.01] [--repeat 30]

A fresh PostgreSQL database (random name, dropped at the end) is migrated and filled with
`INSERT … SELECT generate_series`: `--messages` messages over the 30 days before now (so the
last day holds ~1/30 of them and the last hour ~1/720), 8 routes, a `--live` fraction not final
(PROCESSING, PARTLY_FAILED, WAITING, POSTPONED), the rest OK/FAILED/CANCEL/SKIPPED with
`finished_at` set; a confirmation per 100th message, a tenth of those parked (FAILED_END); two
paused routes. After ANALYZE, `openhub.service.overview.overview()` (every store figure the page shows;
the worker ping is separate and costs its timeout) is run `--repeat` times on a warm pool;
median and max wall-clock times are printed, with the plan of its heaviest query.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from openhub.core.config import reset_settings
from openhub.store.db import utcnow
from openhub.store.migrate import upgrade
from tests.integration.pipeline_stores import postgres_database
from tests.support.process_store import get_engine

MESSAGES = """
WITH g AS (
  SELECT i, (i * 7919) % 10000 AS h,
         CAST(:now AS timestamp) - (CAST(:n AS bigint) - i) * (2592000.0 / :n) * interval '1 second' AS rcv
  FROM generate_series(1, CAST(:n AS bigint)) AS i
), s AS (
  SELECT g.*, CASE
      WHEN h < :live * 10000 * 0.4 THEN 'PARTLY_FAILED' WHEN h < :live * 10000 * 0.7 THEN 'PROCESSING'
      WHEN h < :live * 10000 * 0.9 THEN 'POSTPONED' WHEN h < :live * 10000 THEN 'WAITING'
      WHEN h % 100 < 85 THEN 'OK' WHEN h % 100 < 93 THEN 'FAILED' WHEN h % 100 < 97 THEN 'CANCEL'
      ELSE 'SKIPPED' END AS state,
    g.rcv + (random() * 30) * interval '1 second' AS fin
  FROM g
)
INSERT INTO messages (id, source_system, correlation_id, service, operation, object_id, entity_type, payload,
                      state, failed_count, received_at, msg_timestamp, started_at, updated_at, finished_at,
                      attempts, generation)
SELECT i, 'CRM', 'c-' || i,
       (ARRAY['customer','order','order','billing','billing','stock','crm','ship'])[1 + i % 8],
       (ARRAY['setCustomer','create','bookLine','invoice','refund','reserve','notify','dispatch'])[1 + i % 8],
       'obj-' || (i % 50000), 'entity', '{"n":' || i || '}', state, 0, rcv, rcv, rcv,
       CASE WHEN state IN ('OK','FAILED','CANCEL','SKIPPED') THEN LEAST(fin, CAST(:now AS timestamp)) ELSE rcv END,
       CASE WHEN state IN ('OK','FAILED','CANCEL','SKIPPED') THEN LEAST(fin, CAST(:now AS timestamp)) END, 1, 0
FROM s
"""
CONFIRMATIONS = """
INSERT INTO confirmations (message_id, outcome, state, attempts, created_at, updated_at)
SELECT id, state, CASE WHEN id % 1000 = 0 THEN 'FAILED_END' ELSE 'OK' END, 1, finished_at, finished_at
FROM messages WHERE id % 100 = 0 AND finished_at IS NOT NULL
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--live", type=float, default=0.01, help="fraction of messages not final")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    with postgres_database() as url:
        os.environ["OPENHUB_DATABASE_URL"] = url
        reset_settings()
        upgrade(url)
        now = utcnow()
        engine = get_engine(url)
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(MESSAGES), {"n": args.messages, "now": now, "live": args.live})
            conn.execute(text(CONFIRMATIONS))
            conn.execute(text("SELECT setval(pg_get_serial_sequence('messages', 'id'), :n)"), {"n": args.messages})
            conn.execute(
                text("INSERT INTO route_pauses VALUES ('stock.reserve', :now, 'bench'), ('ship.dispatch', :now, NULL)"),
                {"now": now},
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
            counts = dict(conn.execute(text("SELECT finished_at IS NULL, count(*) FROM messages GROUP BY 1")).all())
        print(
            f"filled {args.messages:,} messages ({counts.get(True, 0):,} not final) "
            f"in {time.perf_counter() - started:.1f} s"
        )

        from openhub.service.overview import overview

        overview(now)  # warm the pool and the caches, as a page refreshing every 5 s does
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            figures = overview(utcnow())
            times.append((time.perf_counter() - t) * 1000)
        from openhub.service import overview as parts
        from tests.support.process_store import transaction

        split = {}
        for name in ("route_states", "finished_series", "confirmation_states", "paused_routes"):
            fn = getattr(parts, name)
            runs = []
            for _ in range(max(3, args.repeat // 3)):
                with transaction() as conn:
                    t = time.perf_counter()
                    fn(conn, utcnow()) if name in ("route_states", "finished_series") else fn(conn)
                    runs.append((time.perf_counter() - t) * 1000)
            split[name] = statistics.median(runs)
        print("median per part: " + ", ".join(f"{k} {v:.1f} ms" for k, v in split.items()))
        hour, day = figures["finished"]["hour_total"], figures["finished"]["day_total"]
        print(
            f"overview(): median {statistics.median(times):.1f} ms, max {max(times):.1f} ms "
            f"over {args.repeat} refreshes; last hour {hour['finished']:,} finished, last day "
            f"{day['finished']:,}, {sum(figures['live_by_state'].values()):,} live, "
            f"{figures['confirmations']['parked_count']:,} parked"
        )
        with engine.connect() as conn:
            plan = (
                conn.execute(
                    text(
                        "EXPLAIN ANALYZE SELECT date_trunc('minute', finished_at), count(*) "
                        "FROM messages WHERE finished_at >= :start AND finished_at < :end "
                        "AND state IN ('OK','FAILED','CANCEL','SKIPPED') GROUP BY 1"
                    ),
                    {
                        "start": now.replace(second=0, microsecond=0) - __import__("datetime").timedelta(days=1),
                        "end": now,
                    },
                )
                .scalars()
                .all()
            )
        print("plan of the finished-per-minute query:\n  " + "\n  ".join(plan))
        with engine.connect() as conn:
            plan = (
                conn.execute(
                    text(
                        "EXPLAIN ANALYZE SELECT service, operation, state, count(*), min(received_at) FROM messages "
                        "WHERE state NOT IN ('CANCEL', 'FAILED', 'OK', 'SKIPPED') GROUP BY service, operation, state"
                    )
                )
                .scalars()
                .all()
            )
        print("plan of the live-rows query:\n  " + "\n  ".join(plan))


if __name__ == "__main__":
    main()
