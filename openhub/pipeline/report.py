"""The traffic report: what the store's messages did over a time range, as Parquet tables.

A message is in the report when it was *received* in [start, end). Definitions, which the tests
recompute in SQL and which the HTML page repeats for its readers:

- `counts`: messages per source system, route (`service.operation`) and current state.
- `route_rates`: per route, `finished` = messages in a final state, `failure_rate` = FAILED /
  finished, `retried` = messages that needed more than one chain attempt (`attempts > 1`),
  `retry_rate` = retried / messages.
- `processing_time`: per route and overall (route `*`), p50/p95/p99/max seconds from received to
  final (`finished_at - received_at`), exact percentiles with linear interpolation (as
  PostgreSQL's `percentile_cont`).
- `throughput_hourly`: per hour, messages received and messages finished (of those in range).
- `ext_call_failures`: per route and step, calls, FAILED calls, failure rate, attempts, mean duration.
- `slowest_routes`: the ten routes with the highest p95 processing time.
- `business_errors`: per error code, occurrences and distinct messages that carry it.
- `http_statuses`: per route, step and HTTP status of the exchanges recorded by `HttpCall(record=True)`
  (status null: no response, a timeout or connection error), exchanges and mean/max duration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openhub.core.states import FINAL, State
from openhub.pipeline.source import Source, read_dependants, read_messages

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

MESSAGE_COLUMNS = [
    "id",
    "source_system",
    "service",
    "operation",
    "state",
    "attempts",
    "failed_count",
    "received_at",
    "finished_at",
    "business_errors",
]
EXT_CALL_COLUMNS = ["id", "message_id", "step_key", "state", "attempts", "duration_ms"]
EXCHANGE_COLUMNS = ["id", "message_id", "step_key", "status", "duration_ms"]
FINAL_STATES = sorted(s.value for s in FINAL)
PERCENTILES = (0.5, 0.95, 0.99)
SLOWEST = 10
# The order of the stages is the order of the progress bar and of the page's sections.
TABLES = (
    "counts",
    "route_rates",
    "processing_time",
    "throughput_hourly",
    "ext_call_failures",
    "slowest_routes",
    "business_errors",
    "http_statuses",
)


@dataclass
class Report:
    """The computed tables (name -> list of row dicts) and what they were computed from."""

    source: str
    start: datetime | None
    end: datetime | None
    generated_at: datetime
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def total(self, column: str, table: str = "counts") -> int:
        """The sum of `column` over a table (e.g. all messages in range)."""
        return sum(int(row[column] or 0) for row in self.tables.get(table, []))


def _rate(part: Any, whole: Any) -> Any:
    from pyspark.sql import functions as F

    return F.when(whole > 0, part / whole).otherwise(F.lit(None).cast("double"))


def _prepared_messages(messages: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    seconds = F.expr("timestampdiff(MICROSECOND, received_at, finished_at)") / F.lit(1_000_000.0)
    return (
        messages.withColumn("route", F.concat_ws(".", "service", "operation"))
        .withColumn("final", F.col("state").isin(FINAL_STATES))
        .withColumn("duration_s", F.when(F.col("state").isin(FINAL_STATES), seconds))
    )


def counts(m: DataFrame) -> DataFrame:
    """Messages per source system, route and state."""
    return (
        m.groupBy("source_system", "route", "state")
        .count()
        .withColumnRenamed("count", "messages")
        .orderBy("source_system", "route", "state")
    )


def route_rates(m: DataFrame) -> DataFrame:
    """Failure and retry rates per route."""
    from pyspark.sql import functions as F

    agg = m.groupBy("route").agg(
        F.count("*").alias("messages"),
        F.sum(F.col("final").cast("long")).alias("finished"),
        F.sum((F.col("state") == State.FAILED.value).cast("long")).alias("failed"),
        F.sum((F.col("attempts") > 1).cast("long")).alias("retried"),
    )
    return (
        agg.withColumn("failure_rate", _rate(F.col("failed"), F.col("finished")))
        .withColumn("retry_rate", _rate(F.col("retried"), F.col("messages")))
        .orderBy("route")
    )


def processing_time(m: DataFrame) -> DataFrame:
    """Processing-time percentiles (received to final) per route and over all routes (`*`)."""
    from pyspark.sql import functions as F

    done = m.where(F.col("duration_s").isNotNull())
    aggs = [
        F.count("duration_s").alias("finished"),
        F.percentile("duration_s", F.array(*[F.lit(p) for p in PERCENTILES])).alias("p"),
        F.max("duration_s").alias("max_s"),
    ]
    per_route = done.groupBy("route").agg(*aggs)
    overall = done.agg(*aggs).withColumn("route", F.lit("*")).where(F.col("finished") > 0)
    both = per_route.unionByName(overall)
    names = [F.col("p")[i].alias(f"p{round(p * 100)}_s") for i, p in enumerate(PERCENTILES)]
    return both.select("route", "finished", *names, "max_s").orderBy("route")


def throughput_hourly(m: DataFrame) -> DataFrame:
    """Messages received and finished per hour."""
    from pyspark.sql import functions as F

    def per_hour(column: str, name: str) -> DataFrame:
        hour = F.date_trunc("hour", F.col(column)).cast("timestamp_ntz").alias("hour")
        return m.where(F.col(column).isNotNull()).groupBy(hour).agg(F.count("*").alias(name))

    received = per_hour("received_at", "received")
    finished = per_hour("finished_at", "finished")
    return received.join(finished, "hour", "full").fillna(0, ["received", "finished"]).orderBy("hour")


def ext_call_failures(m: DataFrame, calls: DataFrame) -> DataFrame:
    """External-call failure rate per route and step."""
    from pyspark.sql import functions as F

    routed = calls.join(m.select(F.col("id").alias("message_id"), "route"), "message_id")
    agg = routed.groupBy("route", "step_key").agg(
        F.count("*").alias("calls"),
        F.sum((F.col("state") == State.FAILED.value).cast("long")).alias("failed"),
        F.sum("attempts").alias("attempts"),
        F.avg("duration_ms").alias("avg_duration_ms"),
    )
    return agg.withColumn("failure_rate", _rate(F.col("failed"), F.col("calls"))).orderBy("route", "step_key")


def slowest_routes(times: DataFrame) -> DataFrame:
    """The routes with the highest p95 processing time."""
    from pyspark.sql import functions as F

    return times.where(F.col("route") != "*").orderBy(F.desc("p95_s"), "route").limit(SLOWEST)


def business_errors(m: DataFrame) -> DataFrame:
    """Occurrences of each business-error code, and how many messages carry it."""
    from pyspark.sql import functions as F

    parsed = F.from_json("business_errors", "array<struct<code:string,text:string>>")
    errors = m.where(F.col("business_errors").isNotNull()).select("id", F.explode(parsed).alias("e"))
    return (
        errors.where(F.col("e.code").isNotNull())
        .groupBy(F.col("e.code").alias("code"))
        .agg(F.count("*").alias("occurrences"), F.countDistinct("id").alias("messages"))
        .orderBy(F.desc("occurrences"), "code")
    )


def http_statuses(m: DataFrame, exchanges: DataFrame) -> DataFrame:
    """Recorded HTTP exchanges per route, step and status, with their mean and longest duration."""
    from pyspark.sql import functions as F

    routed = exchanges.join(m.select(F.col("id").alias("message_id"), "route"), "message_id")
    return (
        routed.groupBy("route", "step_key", "status")
        .agg(
            F.count("*").alias("exchanges"),
            F.avg("duration_ms").alias("avg_duration_ms"),
            F.max("duration_ms").alias("max_duration_ms"),
        )
        .orderBy("route", "step_key", "status")
    )


def _write_table(table: Any, directory: Path) -> None:
    """Write an Arrow table as the single Parquet file of `directory`, replacing what was there."""
    import shutil

    import pyarrow.parquet as pq

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    pq.write_table(table, directory / "part-00000.parquet")


def build_report(
    spark: SparkSession,
    source: Source,
    out: Path,
    start: datetime | None = None,
    end: datetime | None = None,
    progress: Callable[[str], None] = lambda stage: None,
    generated_at: datetime | None = None,
) -> Report:
    """Compute every table, write each as Parquet under `out/<table>/`, and return them."""
    from openhub.store.db import utcnow

    out.mkdir(parents=True, exist_ok=True)
    progress("reading messages")
    # Cached: every table below reads these rows, and from JDBC each read would query the store again.
    m = _prepared_messages(read_messages(spark, source, start, end, MESSAGE_COLUMNS)).persist()
    calls = read_dependants(spark, source, "ext_calls", m, start, end, EXT_CALL_COLUMNS).persist()
    exchanges = read_dependants(spark, source, "http_exchanges", m, start, end, EXCHANGE_COLUMNS)
    report = Report(str(source), start, end, generated_at or utcnow())
    try:
        times = None
        for name in TABLES:
            progress(name.replace("_", " "))
            if name == "counts":
                df = counts(m)
            elif name == "route_rates":
                df = route_rates(m)
            elif name == "processing_time":
                df = times = processing_time(m)
            elif name == "throughput_hourly":
                df = throughput_hourly(m)
            elif name == "ext_call_failures":
                df = ext_call_failures(m, calls)
            elif name == "slowest_routes":
                assert times is not None
                df = slowest_routes(times)
            elif name == "http_statuses":
                df = http_statuses(m, exchanges)
            else:
                df = business_errors(m)
            # The tables are small: one Spark job collects each as Arrow, and the driver writes it.
            # A Spark write would be a second job recomputing the aggregation.
            table = df.toArrow()
            _write_table(table, out / name)
            report.tables[name] = table.to_pylist()
    finally:
        m.unpersist()
        calls.unpersist()
    return report
