"""Benchmark of the Spark pipeline (issues 5, 41): report vs plain SQL on PostgreSQL, and archive rate.

    .venv/bin/python bench/pipeline.py [--sizes 10000,100000,1000000] [--archive 100000]
    .venv/bin/python bench/pipeline.py --matrix --sizes 10000,100000 [--masters local[*],cluster:1,cluster:2]

`--matrix` (issue 41): for each size, the report and the archive of the whole store on each master
(`cluster:N` starts a standalone master and N workers of 1 core / 1 GiB, tests/support/spark_cluster.py)
and as plain SQL (the report's aggregations in PostgreSQL; the archive as COPY of the rows to a file
and DELETE, in one transaction): rows/s, one line per (size, path), with the load average beside it.

A fresh PostgreSQL database (random name, dropped at the end) is filled with
`INSERT … SELECT generate_series` up to each size in turn: messages over 30 days, two external
calls and two transitions per message, a confirmation per confirmed message. At each size:

- `spark`: `build_report` (JDBC partitioned reads, every aggregation, Parquet writes) on a warm
  SparkSession (`local[*]`), without the page; `page`: drawing the charts and writing the HTML;
- `sql`: the same aggregations as plain SQL in PostgreSQL (`sql_report`, the tests' oracle);
- at the largest size also `spark-parquet`: the same report over the store exported to Parquet.

Then `archive` moves the oldest `--archive` messages (cutoff chosen by received time) and the
rate is printed in messages/s. Timings are wall-clock, best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from openhub.store.db import get_engine
from openhub.store.migrate import upgrade
from tests.integration.pipeline_stores import postgres_database, sql_report

BASE = datetime(2026, 10, 1)
SECONDS_PER_ID = 2.592  # 1,000,000 messages spread over 30 days

MESSAGES = """
WITH g AS (
  SELECT i, (i * 7919) % 100 AS h,
         timestamp '2026-10-01' + (i * SPI) * interval '1 second' AS rcv
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
), s AS (
  SELECT g.*, CASE WHEN h < 70 THEN 'OK' WHEN h < 80 THEN 'FAILED' WHEN h < 84 THEN 'CANCEL'
                   WHEN h < 87 THEN 'SKIPPED' WHEN h < 93 THEN 'PROCESSING' ELSE 'PARTLY_FAILED' END AS state,
         g.rcv + (random() * random() * 300) * interval '1 second' AS fin
  FROM g
)
INSERT INTO messages (id, source_system, correlation_id, service, operation, object_id, entity_type, payload,
                      state, failed_count, received_at, msg_timestamp, started_at, updated_at, finished_at,
                      attempts, generation, business_errors)
SELECT i, (ARRAY['CRM','ESHOP','BILLING','WMS'])[1 + i % 4], 'c-' || i,
       (ARRAY['customer','order','order','billing','billing','stock','crm','ship'])[1 + (i / 4) % 8],
       (ARRAY['setCustomer','create','bookLine','invoice','refund','reserve','notify','dispatch'])[1 + (i / 4) % 8],
       'obj-' || (i % 50000), 'entity', '{"n":' || i || ',"text":"payload of a generated message"}',
       state, CASE WHEN h % 5 = 0 THEN 1 ELSE 0 END + CASE WHEN state = 'FAILED' THEN 1 ELSE 0 END,
       rcv, rcv - interval '1 second', rcv,
       CASE WHEN state IN ('OK','FAILED','CANCEL','SKIPPED') THEN fin ELSE rcv END,
       CASE WHEN state IN ('OK','FAILED','CANCEL','SKIPPED') THEN fin END,
       1 + CASE WHEN h % 5 = 0 THEN 1 ELSE 0 END, 0,
       CASE WHEN h % 10 = 3 THEN '[{"code":"E' || (400 + i % 7) || '","text":"refused"}]' END
FROM s
""".replace("SPI", str(SECONDS_PER_ID))
EXT_CALLS = """
INSERT INTO ext_calls (id, key, message_id, step_key, scope, state, msg_timestamp, attempts, created_at, updated_at,
                       duration_ms)
SELECT (m.id - 1) * 2 + k, m.id || '-step' || k, m.id, 'step' || k, 'message',
       CASE WHEN random() < 0.08 THEN 'FAILED' ELSE 'OK' END, m.msg_timestamp, 1 + (random() < 0.2)::int,
       m.received_at, m.updated_at, (random() * 2000)::int
FROM messages m, generate_series(1, 2) AS k WHERE m.id BETWEEN :lo AND :hi
"""
TRANSITIONS = """
INSERT INTO transitions (id, message_id, at, event, from_state, to_state)
SELECT (m.id - 1) * 2 + k, m.id, m.received_at + k * interval '1 millisecond', 'generated',
       CASE WHEN k = 1 THEN NULL ELSE 'PROCESSING' END, CASE WHEN k = 1 THEN 'PROCESSING' ELSE m.state END
FROM messages m, generate_series(1, 2) AS k WHERE m.id BETWEEN :lo AND :hi
"""
CONFIRMATIONS = """
INSERT INTO confirmations (id, message_id, outcome, state, attempts, created_at, updated_at)
SELECT m.id, m.id, m.state, 'OK', 1, m.finished_at, m.finished_at
FROM messages m WHERE m.id BETWEEN :lo AND :hi AND m.state IN ('OK', 'FAILED', 'CANCEL')
"""


def grow(url: str, lo: int, hi: int) -> float:
    """Add messages lo..hi with their dependants; return the seconds it took."""
    started = time.perf_counter()
    with get_engine(url).begin() as conn:
        for sql in (MESSAGES, EXT_CALLS, TRANSITIONS, CONFIRMATIONS):
            conn.execute(text(sql), {"lo": lo, "hi": hi})
    with get_engine(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return time.perf_counter() - started


def best(repeat: int, fn) -> float:  # type: ignore[no-untyped-def]
    """The best wall-clock time of `repeat` calls of fn."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def export_to_parquet(spark, url: str, out: Path) -> None:  # type: ignore[no-untyped-def]
    """The whole store as an archive-shaped Parquet directory (for the Parquet-source figure)."""
    from pyspark.sql import functions as F

    from openhub.pipeline.source import parse_source, read_database

    source = parse_source(url)
    for table in ("messages", "ext_calls"):
        df = read_database(spark, source, table)
        if table == "messages":
            df = df.withColumn("date", F.date_format("received_at", "yyyy-MM-dd"))
        df.write.mode("overwrite").parquet(str(out / table))


ARCHIVE_SQL_TABLES = ("confirmations", "transitions", "ext_calls", "messages")  # children first


def sql_archive(url: str, out: Path) -> int:
    """The plain-SQL archive: COPY every final message and its dependants to CSV, then DELETE them."""
    import psycopg
    from sqlalchemy.engine import make_url

    final = "('OK','FAILED','CANCEL','SKIPPED')"
    picked = f"SELECT id FROM messages WHERE state IN {final}"
    out.mkdir(parents=True, exist_ok=True)
    u = make_url(url)
    with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, dbname=u.database) as conn:
        moved = 0
        for table in ARCHIVE_SQL_TABLES:
            key = "id" if table == "messages" else "message_id"
            with (
                open(out / f"{table}.csv", "wb") as sink,
                conn.cursor().copy(
                    f"COPY (SELECT * FROM {table} WHERE {key} IN ({picked})) TO STDOUT (FORMAT csv)"
                ) as copy,
            ):
                for chunk in copy:
                    sink.write(chunk)
        for table in ARCHIVE_SQL_TABLES:
            key = "id" if table == "messages" else "message_id"
            moved = conn.execute(f"DELETE FROM {table} WHERE {key} IN ({picked})").rowcount
        conn.commit()
    return moved


def load_average() -> str:
    """The 1-minute load average, printed next to every figure (other work shares the cores)."""
    return f"{os.getloadavg()[0]:.1f}"


def matrix(sizes: list[int], masters: list[str], repeat: int) -> None:
    """Report and archive rows/s at each size for plain SQL and each Spark master (issue 41)."""
    import contextlib

    from openhub.pipeline.archive import run_archive
    from openhub.pipeline.report import build_report
    from openhub.pipeline.session import find_jdbc_jar, spark_session
    from openhub.pipeline.source import parse_source
    from tests.support.spark_cluster import cluster_env, standalone_cluster

    os.environ.update({k: v for k, v in cluster_env().items() if k in ("SPARK_LOCAL_IP", "SPARK_HOME")})
    work = Path(tempfile.mkdtemp(prefix="openhub-bench-"))
    print(f"machine: {os.cpu_count()} cores; load average {load_average()} at start")
    print("size,path,report_s,report_rows_per_s,archive_s,archive_rows_per_s,load1")
    for size in sizes:
        for path in ["sql", *masters]:
            with postgres_database() as url, contextlib.ExitStack() as stack:
                upgrade(url)
                grow(url, 1, size)
                spark = None
                if path != "sql":
                    master = path
                    if path.startswith("cluster:"):
                        workers = int(path.split(":")[1])
                        cluster = standalone_cluster(work / f"c-{size}-{workers}", workers)
                        master = stack.enter_context(cluster).master_url
                    spark = spark_session(master, [find_jdbc_jar("postgresql")], "openhub bench")
                    stack.callback(spark.stop)
                    build_report(spark, parse_source(url), work / "warmup")  # JIT, executor start-up
                source = parse_source(url)
                label = "".join(ch if ch.isalnum() else "-" for ch in path)  # "[*]" would be a Spark path glob
                if spark is None:
                    t_report = best(repeat, lambda u=url: sql_report(u))
                else:
                    out = work / f"r-{label}-{size}"
                    t_report = best(repeat, lambda s=spark, src=source, o=out: build_report(s, src, o))
                started = time.perf_counter()
                if spark is None:
                    sql_archive(url, work / f"a-sql-{size}")
                else:
                    run_archive(
                        spark,
                        source,
                        work / f"a-{label}-{size}",
                        timedelta(0),
                        batch_size=100_000,
                        now=BASE + timedelta(days=365),
                    )
                t_archive = time.perf_counter() - started
                print(
                    f"{size},{path},{t_report:.2f},{size / t_report:.0f},{t_archive:.2f},"
                    f"{size / t_archive:.0f},{load_average()}",
                    flush=True,
                )


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--archive", type=int, default=100_000, help="messages to archive (by received time)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--matrix", action="store_true", help="report and archive on SQL and every --masters")
    parser.add_argument("--masters", default="local[*],cluster:1,cluster:2")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.matrix:
        matrix(sizes, args.masters.split(","), args.repeat)
        return

    from openhub.pipeline.archive import run_archive
    from openhub.pipeline.page import write_page
    from openhub.pipeline.report import build_report
    from openhub.pipeline.session import find_jdbc_jar, spark_session
    from openhub.pipeline.source import parse_source

    print(f"machine: {os.cpu_count()} cores; Spark master {args.master}")
    work = Path(tempfile.mkdtemp(prefix="openhub-bench-"))
    started = time.perf_counter()
    spark = spark_session(args.master, [find_jdbc_jar("postgresql")], "openhub bench")
    print(f"spark start-up: {time.perf_counter() - started:.1f} s (paid once per command run)")
    rows = []
    with postgres_database() as url:
        upgrade(url)
        source = parse_source(url)
        done = 0
        warmed = False
        for size in sizes:
            gen = grow(url, done + 1, size)
            done = size
            if not warmed:  # the first Spark jobs of a JVM pay for class loading and JIT
                build_report(spark, source, work / "warmup")
                warmed = True
            out = work / f"report-{size}"
            runs = []
            for _ in range(args.repeat):
                began = time.perf_counter()
                report = build_report(spark, source, out)
                runs.append(time.perf_counter() - began)
            t_spark = min(runs)
            t_page = best(1, lambda report=report, out=out: write_page(report, out))
            t_sql = best(args.repeat, lambda: sql_report(url))
            rows.append((size, t_spark, t_page, t_sql))
            print(
                f"{size:>9,} messages (generated in {gen:.1f} s): spark {t_spark:6.2f} s  "
                f"page {t_page:5.2f} s  sql {t_sql:6.2f} s  spark/sql {t_spark / t_sql:5.1f}x",
                flush=True,
            )
        largest = sizes[-1]
        export = work / "export"
        t_export = best(1, lambda: export_to_parquet(spark, url, export))
        t_parquet = best(
            args.repeat, lambda: build_report(spark, parse_source(f"parquet:{export}"), work / "report-parquet")
        )
        print(
            f"{largest:>9,} messages from Parquet: spark {t_parquet:6.2f} s "
            f"(export through JDBC took {t_export:.1f} s)",
            flush=True,
        )

        cutoff = BASE + timedelta(seconds=args.archive * SECONDS_PER_ID)
        progress_marks: list[float] = []

        def mark(done_: int, total: int, note: str) -> None:
            if total and not progress_marks:
                progress_marks.append(time.perf_counter())

        started = time.perf_counter()
        result = run_archive(
            spark, source, work / "archive", timedelta(0), batch_size=10_000, now=cutoff, progress=mark
        )
        total = time.perf_counter() - started
        batches = time.perf_counter() - progress_marks[0] if progress_marks else total
        print(
            f"archive: {result.messages:,} messages (+{sum(result.rows.values()):,} dependant rows) in "
            f"{result.batches} batches: {total:.1f} s total, {result.messages / total:,.0f} messages/s "
            f"({result.messages / batches:,.0f} messages/s after the eligibility pass of "
            f"{total - batches:.1f} s over {largest:,} messages)"
        )
    spark.stop()


if __name__ == "__main__":
    main()
