"""The archive job: move old final messages, with their history, to Parquet and out of the store.

What moves: a message in a final state (OK, FAILED, CANCEL, SKIPPED) that finished before the
cutoff and whose confirmation is settled (OK or FAILED_END; one still being retried keeps its
message), together with its ext_calls, transitions and confirmations. A message that still owns
an entity- or custom-scope call record stays: that record is the hub's memory of the entity's
last call (it decides whether a late, older message is obsolete), and it is taken over by the
entity's next message, after which the old message can go. Families (a Split parent
and its children, recursively) move together and only as a whole: a parent whose child is still
running stays, and so does the child of a parent that stays, so the archive never holds half a
family and the database never holds an orphan. Non-final messages are never read for writing,
let alone deleted.

How it survives being stopped: see `ledger`. Rows are deleted only after their batch is
published, in one transaction per batch, and only if each message is still the version that was
archived (same state and `updated_at`) and has no rows the archive lacks; a family that changed
in the meantime (an operator restarted it) stays in the database and its stale copy is withdrawn
from the archive. A rerun first finishes what a killed run left behind, so nothing is lost and
nothing is archived twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, select

from openhub.core.errors import ConfigurationError
from openhub.core.states import FINAL, SETTLED_CONFIRMATIONS
from openhub.pipeline.ledger import DEPENDANT_TABLES, ArchiveDir, Manifest
from openhub.pipeline.source import Source, id_list, read_database
from openhub.store import schema
from openhub.store.db import is_postgres, store_now, transaction, utcnow

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

FINAL_STATES = sorted(s.value for s in FINAL)
MAX_FAMILY_DEPTH = 64  # Splits nest a few levels; more means a parent_id cycle, never archived.
_UNKNOWN: Any = object()
_CHUNK = 5000  # ids per SQL statement: below SQLite's variable limit, and short enough to parse fast
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

Progress = Callable[[int, int, str], None]  # (messages done, messages planned, what is happening)


def parse_duration(text: str) -> timedelta:
    """Parse `30d`, `12h`, `15m`, `0s` or `2w` into a timedelta."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigurationError(f"invalid duration {text!r}: use a number and a unit, e.g. 30d, 12h, 15m, 0s")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


@dataclass
class ArchiveResult:
    """What a run did: batches and messages archived, rows per table, and recovery work."""

    batches: int = 0
    messages: int = 0
    rows: dict[str, int] = field(default_factory=lambda: {t: 0 for t in DEPENDANT_TABLES})
    withdrawn: int = 0
    recovered_batches: int = 0
    discarded_batches: int = 0


@dataclass(frozen=True)
class Member:
    """An eligible message and its place in its family."""

    id: int
    root: int
    depth: int


def _ts_literal(moment: datetime) -> Any:
    from pyspark.sql import functions as F

    return F.lit(moment.strftime("%Y-%m-%d %H:%M:%S.%f")).cast("timestamp_ntz")


def find_eligible(spark: SparkSession, source: Source, cutoff: datetime) -> list[Member]:
    """Every message that may be archived now, whole families only, ordered by family.

    Spark judges each message (one pass over messages, confirmations and call records); the
    family closure then runs on the driver over the rows that matter to it, the eligible ones
    and those linked by a parent, because the batch plan is made there anyway and walking parent
    links in Python is one pass where Spark would need a join per family level.
    """
    from pyspark.sql import functions as F

    m = read_database(spark, source, "messages", columns=["id", "parent_id", "state", "finished_at"])
    settled = ", ".join(f"'{s}'" for s in sorted(SETTLED_CONFIRMATIONS))
    unsettled = read_database(spark, source, "confirmations", f"state NOT IN ({settled})", ["message_id"])
    # An entity- or custom-scope call record is shared by every message of its entity: the hub
    # reads it to tell an obsolete message from a new one, so its current owner must stay.
    shared = read_database(spark, source, "ext_calls", "scope <> 'message'", ["message_id"])
    held = unsettled.unionByName(shared).distinct().select(F.col("message_id").alias("id"), F.lit(True).alias("held"))
    parents = (
        m.where(F.col("parent_id").isNotNull())
        .select(F.col("parent_id").alias("id"))
        .distinct()
        .withColumn("is_parent", F.lit(True))
    )
    ok = (
        F.col("state").isin(FINAL_STATES)
        & F.col("finished_at").isNotNull()
        & (F.col("finished_at") < _ts_literal(cutoff))
        & F.col("held").isNull()
    )
    judged = (
        m.join(held, "id", "left")
        .join(parents, "id", "left")
        .select("id", "parent_id", ok.alias("ok"), F.col("is_parent").isNotNull().alias("is_parent"))
    )
    relevant = judged.where(F.col("ok") | F.col("parent_id").isNotNull() | F.col("is_parent"))
    table = relevant.select("id", "parent_id", "ok").toArrow()
    ids, parent_ids, oks = (table.column(c).to_pylist() for c in ("id", "parent_id", "ok"))
    return _whole_families(dict(zip(ids, parent_ids)), dict(zip(ids, oks)))


def _whole_families(parent_of: dict[int, int | None], ok: dict[int, bool]) -> list[Member]:
    """Members of the families whose every message is eligible, ordered by (root, depth, id)."""
    place: dict[int, tuple[int, int] | None] = {}  # id -> (root, depth); None: no root reachable

    def locate(mid: int) -> tuple[int, int] | None:
        chain, current = [], mid
        while current not in place:
            parent = parent_of.get(current, _UNKNOWN)
            if parent is None:
                place[current] = (current, 0)
            elif parent is _UNKNOWN or len(chain) >= MAX_FAMILY_DEPTH:
                place[current] = None  # a parent not seen, or a cycle: never archived
            else:
                chain.append(current)
                current = parent
        found = place[current]
        for child in reversed(chain):
            found = (found[0], found[1] + 1) if found else None
            place[child] = found
        return place[mid]

    located = {mid: locate(mid) for mid in parent_of}
    blocked = {where[0] if where else mid for mid, where in located.items() if where is None or not ok[mid]}
    members = [
        Member(mid, where[0], where[1])
        for mid, where in located.items()
        if where is not None and where[0] not in blocked
    ]
    return sorted(members, key=lambda m: (m.root, m.depth, m.id))


def plan_batches(members: list[Member], batch_size: int) -> list[list[Member]]:
    """Cut the eligible messages into batches of about `batch_size`, never splitting a family."""
    batches: list[list[Member]] = []
    current: list[Member] = []
    for i, member in enumerate(members):
        current.append(member)
        last_of_family = i + 1 == len(members) or members[i + 1].root != member.root
        if last_of_family and len(current) >= batch_size:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


def stage_batch(
    spark: SparkSession, source: Source, archive: ArchiveDir, batch: str, members: list[Member], cutoff: datetime
) -> Manifest:
    """Write one batch's rows under staging with Spark and describe them from the files written."""
    from pyspark.sql import functions as F

    ids = id_list(m.id for m in members)
    messages = read_database(spark, source, "messages", f"id IN ({ids})", partitioned=False)
    (
        messages.withColumn("date", F.date_format("received_at", "yyyy-MM-dd"))
        .withColumn("route", F.concat_ws(".", "service", "operation"))
        .write.mode("overwrite")
        .partitionBy("date", "route")
        .parquet(str(archive.stage_path(batch, "messages")))
    )
    # Partition keys come from the staged copy, so each call lands beside the message version archived.
    staged = spark.read.parquet(str(archive.stage_path(batch, "messages")))
    keys = staged.select(F.col("id").alias("message_id"), "date", "route")
    for table in DEPENDANT_TABLES:
        rows = read_database(spark, source, table, f"message_id IN ({ids})", partitioned=False)
        (
            rows.join(keys, "message_id")
            .write.mode("overwrite")
            .partitionBy("date", "route")
            .parquet(str(archive.stage_path(batch, table)))
        )
    return _describe(archive, batch, members, cutoff)


def _read_columns(paths: list[Path], columns: list[str]) -> dict[str, list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not paths:
        return {c: [] for c in columns}
    data = pa.concat_tables([pq.ParquetFile(p).read(columns=columns) for p in paths])
    return {c: data.column(c).to_pylist() for c in columns}


def _describe(archive: ArchiveDir, batch: str, members: list[Member], cutoff: datetime) -> Manifest:
    family = {m.id: m for m in members}
    staged = _read_columns(archive.staged_files(batch, "messages"), ["id", "updated_at", "state"])
    messages = [
        [i, family[i].root, family[i].depth, updated.isoformat(), state]
        for i, updated, state in zip(staged["id"], staged["updated_at"], staged["state"])
    ]
    rows = {}
    for table in DEPENDANT_TABLES:
        found = _read_columns(archive.staged_files(batch, table), ["id", "message_id"])
        rows[table] = [[i, m] for i, m in zip(found["id"], found["message_id"])]
    return Manifest(batch=batch, cutoff=cutoff.isoformat(), messages=sorted(messages), rows=rows)


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    ids = list(ids)
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


def _changed_roots(conn: Connection, manifest: Manifest, info: dict[int, list[Any]]) -> tuple[set[int], set[int]]:
    """Families that differ from their archived copy, and the archived ids still in the database."""
    m = schema.messages
    present: set[int] = set()
    changed: set[int] = set()
    for chunk in _chunks(info):
        query = select(m.c.id, m.c.state, m.c.updated_at).where(m.c.id.in_(chunk))
        if is_postgres(conn):
            query = query.with_for_update()  # nobody changes them between this check and the delete
        for row in conn.execute(query):
            present.add(row.id)
            if (row.state, row.updated_at.isoformat()) != (info[row.id][4], info[row.id][3]):
                changed.add(info[row.id][1])
    # A row the archive lacks (a new call, transition or child), or an archived row that now
    # belongs elsewhere or is gone, means the family moved on since it was archived.
    for table in DEPENDANT_TABLES:
        archived = {r[0]: r[1] for r in manifest.rows[table] if r[1] in present}
        current: dict[int, int] = {}
        t = getattr(schema, table)
        for chunk in _chunks(present):
            query = select(t.c.id, t.c.message_id).where(t.c.message_id.in_(chunk))
            if is_postgres(conn):
                query = query.with_for_update()
            current.update((row.id, row.message_id) for row in conn.execute(query))
        for row_id, message_id in current.items():
            if archived.get(row_id) != message_id:
                changed.add(info[message_id][1])
        for row_id, message_id in archived.items():
            if current.get(row_id) != message_id:
                changed.add(info[message_id][1])
    for chunk in _chunks(present):
        query = select(m.c.id, m.c.parent_id).where(m.c.parent_id.in_(chunk))
        for row in conn.execute(query):
            if row.id not in info:
                changed.add(info[row.parent_id][1])
    return changed, present


def delete_batch(url: str, manifest: Manifest) -> set[int]:
    """Delete a published batch's rows from the store; return the ids of families that changed."""
    withdrawn = set(manifest.withdrawn)
    info = {row[0]: row for row in manifest.messages if row[0] not in withdrawn}
    with transaction(url) as conn:
        changed_roots, present = _changed_roots(conn, manifest, info)
        doomed = {i for i in present if info[i][1] not in changed_roots}
        for table in DEPENDANT_TABLES:
            t = getattr(schema, table)
            row_ids = [r[0] for r in manifest.rows[table] if r[1] in doomed]
            for chunk in _chunks(row_ids):
                conn.execute(delete(t).where(t.c.id.in_(chunk)))
        # Children before parents, so the parent_id foreign key holds after every statement.
        for depth in sorted({info[i][2] for i in doomed}, reverse=True):
            level = [i for i in doomed if info[i][2] == depth]
            for chunk in _chunks(level):
                conn.execute(delete(schema.messages).where(schema.messages.c.id.in_(chunk)))
    return {i for i, row in info.items() if row[1] in changed_roots}


def settle(archive: ArchiveDir, url: str, manifest: Manifest) -> int:
    """Delete a published batch from the store, withdraw what changed, and mark it settled."""
    changed = delete_batch(url, manifest)
    if changed:
        archive.withdraw(manifest.batch, changed)
        manifest.withdrawn = sorted(set(manifest.withdrawn) | changed)
    manifest.settled = True
    archive.save(manifest)
    return len(changed)


def run_archive(
    spark: SparkSession,
    source: Source,
    out: Path,
    older_than: timedelta,
    batch_size: int = 10_000,
    now: datetime | None = None,
    progress: Progress = lambda done, total, note: None,
) -> ArchiveResult:
    """Archive every eligible message older than `older_than` from `source` into `out`."""
    if not source.is_database:
        raise ConfigurationError(f"cannot archive from {source}: the source must be a database")
    if batch_size < 1:
        raise ConfigurationError(f"--batch-size must be at least 1, got {batch_size}")
    archive = ArchiveDir(out.absolute())
    result = ArchiveResult()
    cutoff = (now or store_now(source.location)) - older_than  # the clock finished_at was written by
    with archive.locked():
        progress(0, 0, "recovering an interrupted run")
        published, discarded = archive.recover_staging()
        result.recovered_batches, result.discarded_batches = len(published), len(discarded)
        for manifest in archive.manifests():
            if not manifest.settled:
                result.withdrawn += settle(archive, source.location, manifest)
        progress(0, 0, "finding final messages older than the cutoff")
        batches = plan_batches(find_eligible(spark, source, cutoff), batch_size)
        total = sum(len(b) for b in batches)
        progress(0, total, f"{len(batches)} batches")
        for number, members in enumerate(batches, 1):
            batch = f"{utcnow():%Y%m%dT%H%M%S%f}-{members[0].id}"
            manifest = stage_batch(spark, source, archive, batch, members, cutoff)
            archive.seal(manifest)
            manifest = archive.publish(batch)
            result.withdrawn += settle(archive, source.location, manifest)
            result.batches += 1
            result.messages += len(manifest.archived_ids())
            for table in DEPENDANT_TABLES:
                result.rows[table] += len(manifest.rows[table])
            progress(result.messages, total, f"batch {number}/{len(batches)}")
    return result
