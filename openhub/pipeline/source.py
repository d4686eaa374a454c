"""Where a pipeline job reads the store from, and the one column layout every source yields.

A source is the database (PostgreSQL or SQLite, read through JDBC) or an archive written by
`openhub archive` (Parquet). Whatever the source, a table comes out with the columns and types
derived from `openhub.store.schema`: integers as bigint, text as string, timestamps as timestamp_ntz
(the store keeps naive UTC). So the report cannot tell a live store from an archive, and archive
batches written from SQLite and from PostgreSQL share one Parquet schema.

Source specs (`--source`): a SQLAlchemy URL (`postgresql+psycopg://…`, `sqlite:///path`),
`parquet:DIR`, or a bare path (a directory is an archive, a file a SQLite store).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import DateTime, Integer, Table, text
from sqlalchemy.engine import make_url

from openhub.core.config import get_settings
from openhub.core.errors import ConfigurationError
from openhub.pipeline.session import DRIVERS, find_jdbc_jar
from openhub.store import schema
from openhub.store.db import get_engine

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

TABLES: dict[str, Table] = {
    "messages": schema.messages,
    "ext_calls": schema.ext_calls,
    "transitions": schema.transitions,
    "confirmations": schema.confirmations,
    "http_exchanges": schema.http_exchanges,
    "waits": schema.waits,
}
# A PostgreSQL read is cut into ranges of `id`, each one Spark task on its own JDBC connection,
# of about ROWS_PER_PARTITION rows (a read of a few seconds), and into no more than MAX_PARTITIONS.
# Connections open at once: min(partitions, the executors' cores), plus the driver's one for the
# min/max query (closed before the read starts).
ROWS_PER_PARTITION = 100_000
MAX_PARTITIONS = 64
FETCH_SIZE = 10_000  # rows per round trip: a partition streams through a cursor, never all in memory
_TS_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # SQLAlchemy's SQLite storage format, so text compares as time


def spark_type(column) -> str:  # type: ignore[no-untyped-def]
    """The canonical Spark SQL type of a store column."""
    if isinstance(column.type, DateTime):
        return "timestamp_ntz"
    if isinstance(column.type, Integer):
        return "bigint"
    return "string"


def columns_of(table: str) -> list[str]:
    """The column names of a store table, in schema order."""
    return [c.name for c in TABLES[table].columns]


@dataclass(frozen=True)
class Source:
    """A readable store: `kind` is "postgresql", "sqlite" or "parquet"; `location` a URL or directory."""

    kind: str
    location: str

    @property
    def is_database(self) -> bool:
        """Whether this source is a live database (and so can be archived from)."""
        return self.kind in DRIVERS

    def jdbc_url(self) -> str:
        """The JDBC URL of a database source."""
        url = make_url(self.location)
        if self.kind == "sqlite":
            return f"jdbc:sqlite:{Path(url.database or '').absolute()}"
        return f"jdbc:postgresql://{url.host or '127.0.0.1'}:{url.port or 5432}/{url.database}"

    def jdbc_options(self) -> dict[str, str]:
        """Connection options for Spark's JDBC reader (URL, driver class, credentials)."""
        url = make_url(self.location)
        options = {"url": self.jdbc_url(), "driver": DRIVERS[self.kind].driver_class}
        if self.kind == "postgresql":
            options["user"] = url.username or "postgres"
            if url.password:
                options["password"] = url.password
            # Without a fetch size the PostgreSQL driver loads a whole partition into memory.
            options["fetchsize"] = str(read_settings().fetch_size)
        return options

    def __str__(self) -> str:
        if self.kind == "postgresql":
            return make_url(self.location).render_as_string(hide_password=True)
        return self.location


@dataclass(frozen=True)
class ReadSettings:
    """How a database read is partitioned (OPENHUB_SPARK_JDBC_*; see the module's constants)."""

    rows_per_partition: int = ROWS_PER_PARTITION
    max_partitions: int = MAX_PARTITIONS
    fetch_size: int = FETCH_SIZE

    def partitions(self, rows: int) -> int:
        """How many id ranges a read of `rows` rows is cut into."""
        return max(1, min(-(-rows // self.rows_per_partition), self.max_partitions))


def _positive(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ConfigurationError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


def read_settings() -> ReadSettings:
    """The partitioning of JDBC reads, from OPENHUB_SPARK_JDBC_PARTITION_ROWS, _PARTITIONS, _FETCHSIZE."""
    return ReadSettings(
        _positive("OPENHUB_SPARK_JDBC_PARTITION_ROWS", ROWS_PER_PARTITION),
        _positive("OPENHUB_SPARK_JDBC_PARTITIONS", MAX_PARTITIONS),
        _positive("OPENHUB_SPARK_JDBC_FETCHSIZE", FETCH_SIZE),
    )


def parse_source(spec: str | None) -> Source:
    """Turn a `--source` value (default: OPENHUB_DATABASE_URL) into a Source."""
    spec = spec or get_settings().database_url
    if spec.startswith("parquet:"):
        return Source("parquet", str(Path(spec[len("parquet:") :]).absolute()))
    if spec.startswith("postgresql"):
        return Source("postgresql", spec)
    if spec.startswith("sqlite"):
        return Source("sqlite", spec)
    if "://" in spec:
        raise ConfigurationError(f"unsupported source {spec!r}: use a postgresql:// or sqlite:/// URL or parquet:DIR")
    path = Path(spec)
    if path.is_dir():
        return Source("parquet", str(path.absolute()))
    if path.is_file():
        return Source("sqlite", f"sqlite:///{path.absolute()}")
    raise ConfigurationError(
        f"source not found: {spec} is neither a database URL, a SQLite file nor an archive directory"
    )


def jars_for(source: Source, explicit: str | None = None) -> list[str]:
    """The driver jars a job on `source` needs (none for Parquet)."""
    return [find_jdbc_jar(source.kind, explicit)] if source.is_database else []


def _literal(moment: datetime) -> str:
    return f"'{moment.strftime(_TS_FORMAT)}'"


def range_condition(start: datetime | None, end: datetime | None, column: str = "received_at") -> str:
    """SQL for `start <= column < end` (either bound optional) that both dialects evaluate alike."""
    parts = []
    if start is not None:
        parts.append(f"{column} >= {_literal(start)}")
    if end is not None:
        parts.append(f"{column} < {_literal(end)}")
    return " AND ".join(parts) or "1 = 1"


def id_list(ids: Iterable[int]) -> str:
    """A SQL list of integer ids; `int()` makes it injection-proof."""
    return ", ".join(str(int(i)) for i in ids) or "NULL"


def _select_list(source: Source, table: str, columns: list[str]) -> str:
    # SQLite's JDBC driver maps DATETIME to DATE and drops the time of day; read the stored text.
    parts = []
    for name in columns:
        column = TABLES[table].c[name]
        if source.kind == "sqlite" and isinstance(column.type, DateTime):
            parts.append(f"CAST({name} AS TEXT) AS {name}")
        else:
            parts.append(name)
    return ", ".join(parts)


def canonical(df: DataFrame, table: str, columns: list[str]) -> DataFrame:
    """Cast `df`'s columns to the canonical types of `table`, in the given order."""
    from pyspark.sql import functions as F

    return df.select([F.col(n).cast(spark_type(TABLES[table].c[n])).alias(n) for n in columns])


def _id_bounds(source: Source, table: str, where: str) -> tuple[int, int, int]:
    with get_engine(source.location).connect() as conn:
        row = conn.execute(text(f"SELECT min(id), max(id), count(*) FROM {table} WHERE {where}")).one()
    return int(row[0] or 0), int(row[1] or 0), int(row[2])


def read_database(
    spark: SparkSession,
    source: Source,
    table: str,
    where: str = "1 = 1",
    columns: list[str] | None = None,
    partitioned: bool = True,
) -> DataFrame:
    """Read `table` rows matching the SQL condition `where` through JDBC, canonically typed.

    On PostgreSQL the read is split into ranges of `id` between the rows' min and max (one quick
    indexed query on the driver), each its own JDBC connection and Spark task: a plain SELECT
    under MVCC that takes no row lock, so the hub's inserts and updates never wait for it, and
    whose snapshot lives only as long as its range takes to stream. SQLite is one file behind
    one lock, so it is read in one piece.
    """
    columns = columns or columns_of(table)
    query = f"(SELECT {_select_list(source, table, columns)} FROM {table} WHERE {where}) AS src"
    reader = spark.read.format("jdbc").options(**source.jdbc_options()).option("dbtable", query)
    reader = reader.option("preferTimestampNTZ", "true")
    if source.kind == "sqlite":
        # SQLite types by value, so its driver guesses a column's type from what it sees (a NULL
        # timestamp becomes DECIMAL); pin every column, timestamps as text parsed by Spark.
        reader = reader.option(
            "customSchema",
            ", ".join(
                f"{n} {'string' if (kind := spark_type(TABLES[table].c[n])) == 'timestamp_ntz' else kind}"
                for n in columns
            ),
        )
    if partitioned and source.kind == "postgresql" and "id" in columns:
        low, high, count = _id_bounds(source, table, where)
        partitions = read_settings().partitions(count)
        if partitions > 1:
            reader = reader.options(
                partitionColumn="id", lowerBound=str(low), upperBound=str(high + 1), numPartitions=str(partitions)
            )
    return canonical(reader.load(), table, columns)


def empty_table(spark: SparkSession, table: str, columns: list[str] | None = None) -> DataFrame:
    """An empty DataFrame with the canonical columns of `table`."""
    columns = columns or columns_of(table)
    ddl = ", ".join(f"{n} {spark_type(TABLES[table].c[n])}" for n in columns)
    return spark.createDataFrame([], ddl)


def read_archive(
    spark: SparkSession,
    source: Source,
    table: str,
    columns: list[str] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> DataFrame:
    """Read `table` from an archive directory, without its `date`/`route` partition columns.

    With a range, only the `date=` partitions that can hold messages received in it are read
    (every table is partitioned by its message's received date).
    """
    from pyspark.sql import functions as F

    columns = columns or columns_of(table)
    path = Path(source.location) / table
    if not any(path.rglob("*.parquet")):
        return empty_table(spark, table, columns)
    df = spark.read.option("basePath", str(path)).parquet(str(path))
    if "date" in df.columns:
        if start is not None:
            df = df.where(F.col("date") >= start.strftime("%Y-%m-%d"))
        if end is not None:
            df = df.where(F.col("date") <= end.strftime("%Y-%m-%d"))
    return canonical(df, table, columns)


def read_messages(
    spark: SparkSession, source: Source, start: datetime | None, end: datetime | None, columns: list[str] | None = None
) -> DataFrame:
    """Messages received in [start, end) from any source."""
    if source.is_database:
        return read_database(spark, source, "messages", range_condition(start, end), columns)
    from pyspark.sql import functions as F

    df = read_archive(spark, source, "messages", columns, start, end)
    if start is not None:
        df = df.where(F.col("received_at") >= F.lit(start).cast("timestamp_ntz"))
    if end is not None:
        df = df.where(F.col("received_at") < F.lit(end).cast("timestamp_ntz"))
    return df


def read_dependants(
    spark: SparkSession,
    source: Source,
    table: str,
    messages: DataFrame,
    start: datetime | None,
    end: datetime | None,
    columns: list[str] | None = None,
) -> DataFrame:
    """Rows of `table` (ext_calls, transitions, confirmations) that belong to `messages`."""
    if source.is_database:
        # Filter in the database: only the calls of messages in range cross the wire. Without a
        # range, no filter: every partition would otherwise repeat a semi-join over all messages.
        where = (
            "1 = 1"
            if start is None and end is None
            else f"message_id IN (SELECT id FROM messages WHERE {range_condition(start, end)})"
        )
        return read_database(spark, source, table, where, columns)
    df = read_archive(spark, source, table, columns, start, end)
    if start is None and end is None:
        return df  # an archive holds no row without its message: the join would be a costly no-op
    return df.join(messages.select(messages.id.alias("message_id")), "message_id", "left_semi")
