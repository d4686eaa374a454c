"""`openhub archive` on real Spark (local) against generated SQLite and PostgreSQL stores.

The invariant checked everywhere: every row that was in the store before is afterwards either
still in the store or in the archive, never both and never twice, with the same contents; what
moved is exactly what the rules allow (final, old, confirmation settled, no shared call record,
whole families); non-final messages are untouched. It must hold after a clean run, after a run
killed with SIGKILL midway and run again, and when a message changes between archive and delete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from openhub.store import schema
from openhub.store.db import transaction, utcnow

from .pipeline_stores import (  # noqa: F401 - the two fixtures are used by name
    FINAL,
    NOW,
    TABLES,
    archive_midway,
    backend_url_fixture,
    generate_store,
    snapshot,
    spark_fixture,
    store_url,
    wait_while_running,
)

Rows = dict[str, dict[int, dict[str, Any]]]


def read_archive(out: Path) -> tuple[Rows, list[tuple[str, int]]]:
    """Every archived row by table and id (read with pyarrow, not Spark), and any duplicates."""
    import pyarrow.parquet as pq

    rows: Rows = {t: {} for t in TABLES}
    duplicates = []
    for table in TABLES:
        for path in sorted((out / table).rglob("*.parquet")) if (out / table).exists() else []:
            if path.name.startswith((".", "_")):
                continue
            parts = dict(p.split("=", 1) for p in path.parent.relative_to(out / table).parts)
            assert set(parts) == {"date", "route"}, path
            for row in pq.ParquetFile(path).read().to_pylist():
                if row["id"] in rows[table]:
                    duplicates.append((table, row["id"]))
                rows[table][row["id"]] = row
                if table == "messages":  # partitioned by the message's received date and route
                    assert parts["date"] == row["received_at"].strftime("%Y-%m-%d"), path
                    assert parts["route"] == f"{row['service']}.{row['operation']}", path
    return rows, duplicates


def expected_archived(before: Rows, cutoff: datetime) -> set[int]:
    """The message ids the rules allow to move, computed independently of the pipeline."""
    messages = before["messages"]
    held = {c["message_id"] for c in before["confirmations"].values() if c["state"] not in ("OK", "FAILED_END")}
    held |= {c["message_id"] for c in before["ext_calls"].values() if c["scope"] != "message"}

    def root(mid: int) -> int:
        while messages[mid]["parent_id"] is not None:
            mid = messages[mid]["parent_id"]
        return mid

    families: dict[int, list[int]] = defaultdict(list)
    for mid in messages:
        families[root(mid)].append(mid)

    def ok(m: dict[str, Any]) -> bool:
        return (
            m["state"] in FINAL and m["finished_at"] is not None and m["finished_at"] < cutoff and m["id"] not in held
        )

    return {mid for members in families.values() if all(ok(messages[m]) for m in members) for mid in members}


def assert_nothing_lost_nothing_duplicated(before: Rows, after: Rows, out: Path, cutoff: datetime) -> Rows:
    """The round-trip invariant (see the module docstring); returns the archive's rows."""
    archived, duplicates = read_archive(out)
    assert duplicates == []
    for table in TABLES:
        both = archived[table].keys() & after[table].keys()
        assert not both, f"{table}: {len(both)} rows both archived and still stored"
        union = {**after[table], **archived[table]}
        assert union.keys() == before[table].keys(), f"{table}: rows lost or invented"
        for row_id, row in before[table].items():
            assert union[row_id] == row, f"{table} {row_id} changed on the way"
    expected = expected_archived(before, cutoff)
    assert set(archived["messages"]) == expected
    assert 0 < len(expected) < len(before["messages"])  # the store offers both kinds
    for mid, message in before["messages"].items():
        if message["state"] not in FINAL:
            assert after["messages"][mid] == message
    for message in after["messages"].values():  # no orphan left behind
        assert message["parent_id"] is None or message["parent_id"] in after["messages"]
    for table in TABLES[1:]:
        assert all(r["message_id"] in archived["messages"] for r in archived[table].values())
    assert not any((out / "_staging").iterdir())
    return archived


def test_archive_round_trip(spark, backend_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from openhub.pipeline.archive import run_archive
    from openhub.pipeline.ledger import ArchiveDir
    from openhub.pipeline.source import parse_source

    generate_store(backend_url, roots=160, seed=21)
    before = snapshot(backend_url)
    out = tmp_path / "archive"
    result = run_archive(spark, parse_source(backend_url), out, timedelta(hours=1), batch_size=37, now=NOW)
    after = snapshot(backend_url)
    archived = assert_nothing_lost_nothing_duplicated(before, after, out, NOW - timedelta(hours=1))
    assert result.messages == len(archived["messages"])
    assert result.batches >= 2
    assert result.rows == {t: len(archived[t]) for t in TABLES[1:]}
    assert all(m.settled and not m.withdrawn for m in ArchiveDir(out).manifests())
    # Run again: nothing more is eligible and nothing moves.
    again = run_archive(spark, parse_source(backend_url), out, timedelta(hours=1), batch_size=37, now=NOW)
    assert again.messages == 0
    assert snapshot(backend_url) == after
    assert read_archive(out)[0] == archived


def test_changed_family_is_withdrawn_not_deleted(spark, backend_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An operator restarts a message after it was archived but before the delete: the live row wins."""
    from openhub.pipeline.archive import find_eligible, settle, stage_batch
    from openhub.pipeline.ledger import ArchiveDir
    from openhub.pipeline.source import parse_source
    from openhub.pipeline.source import read_archive as spark_read_archive

    generate_store(backend_url, roots=80, seed=9)
    source = parse_source(backend_url)
    cutoff = NOW - timedelta(hours=1)
    archive = ArchiveDir(tmp_path / "archive")
    archive.prepare()
    members = find_eligible(spark, source, cutoff)
    sizes: dict[int, int] = defaultdict(int)
    for m in members:
        sizes[m.root] += 1
    victim_root = max(sizes, key=lambda r: (sizes[r], r))  # the biggest family: a Split with children
    family = {m.id for m in members if m.root == victim_root}
    victim = max(family)  # a child (or grandchild), so its parent's delete would break the foreign key
    manifest = stage_batch(spark, source, archive, "b-test", members, cutoff)
    archive.seal(manifest)
    manifest = archive.publish("b-test")
    with transaction(backend_url) as conn:
        conn.execute(
            update(schema.messages)
            .where(schema.messages.c.id == victim)
            .values(state="PARTLY_FAILED", failed_count=0, finished_at=None, updated_at=utcnow())
        )
    before = snapshot(backend_url)
    assert settle(archive, backend_url, manifest) == len(family) > 1
    after = snapshot(backend_url)
    archived, duplicates = read_archive(archive.root)
    assert duplicates == []
    assert family <= after["messages"].keys() and not family & archived["messages"].keys()
    assert after["messages"] == {i: before["messages"][i] for i in after["messages"]}
    moved = {m.id for m in members} - family
    assert archived["messages"].keys() == moved and not moved & after["messages"].keys()
    for table in TABLES[1:]:
        assert not any(r["message_id"] in family for r in archived[table].values())
        assert {**after[table], **archived[table]} == before[table]
    assert withdrawn_ids(archive) == family
    # Spark still reads the rewritten files.
    assert spark_read_archive(spark, parse_source(f"parquet:{archive.root}"), "messages").count() == len(moved)


def withdrawn_ids(archive: Any) -> set[int]:
    """All withdrawn ids recorded in the archive's manifests."""
    return {i for m in archive.manifests() for i in m.withdrawn}


def test_archive_killed_midway_then_rerun(spark, backend_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL `archive` (and its JVM) while a batch is half written, then run it again."""
    from openhub.pipeline.archive import run_archive
    from openhub.pipeline.source import parse_source

    generate_store(backend_url, roots=130, seed=33, now=utcnow())
    before = snapshot(backend_url)
    out = tmp_path / "archive"
    log = tmp_path / "archive.log"
    command = [
        sys.executable,
        "-m",
        "openhub.pipeline.commands",
        "archive",
        "--older-than",
        "1h",
        "--out",
        str(out),
        "--batch-size",
        "10",
        "--master",
        "local[1]",
        "--source",
        backend_url,
    ]
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # two batches deleted from the store, a third one half written
        midway = lambda: archive_midway(out, backend_url, len(before["messages"]), published=2)  # noqa: E731
        wait_while_running(midway, process, log, timeout=240)
        os.killpg(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    interrupted = snapshot(backend_url)
    assert len(interrupted["messages"]) < len(before["messages"])  # it had deleted some batches
    # What the kill left in staging: the batch seen being written, unless it was finished in the moment
    # between that look and the kill (a CI run on a loaded box: nothing left, the rerun had nothing to find).
    left = [d for d in (out / "_staging").iterdir() if d.is_dir()] if (out / "_staging").exists() else []

    rerun_at = utcnow()
    result = run_archive(spark, parse_source(backend_url), out, timedelta(hours=1), batch_size=10, now=rerun_at)
    assert result.recovered_batches + result.discarded_batches == len(left)  # it finished each half-done batch
    after = snapshot(backend_url)
    assert_nothing_lost_nothing_duplicated(before, after, out, rerun_at - timedelta(hours=1))


def publish_killed_after_two_files(archive: Any, batch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Publish `batch` but die (as a kill would) after two of its files were moved into place."""
    from openhub.pipeline import ledger

    real_replace, moved = ledger.os.replace, []

    def replace_then_die(src: Any, dst: Any) -> None:
        if len(moved) == 2:
            raise KeyboardInterrupt("killed while publishing")
        real_replace(src, dst)
        moved.append(dst)

    monkeypatch.setattr(ledger.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        archive.publish(batch)
    monkeypatch.undo()


def test_rerun_completes_batches_stopped_at_every_stage(
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leave four batches exactly where a crash at each stage would, then rerun once.

    Staged but not sealed (discarded, its rows archived again later), sealed (rolled forward),
    killed halfway through publishing (rolled forward), published but not yet deleted (settled).
    """
    from openhub.pipeline import ledger
    from openhub.pipeline.archive import (
        find_eligible,
        plan_batches,
        run_archive,
        stage_batch,
    )
    from openhub.pipeline.source import parse_source

    cutoff = NOW - timedelta(hours=1)
    with store_url("sqlite", str(tmp_path)) as url:
        generate_store(url, roots=100, seed=44)
        before = snapshot(url)
        source = parse_source(url)
        archive = ledger.ArchiveDir(tmp_path / "archive")
        archive.prepare()
        batches = plan_batches(find_eligible(spark, source, cutoff), 10)
        assert len(batches) >= 5  # four left behind, at least one for the rerun itself
        for name, members in zip(("staged", "sealed", "mid-publish", "published"), batches):
            manifest = stage_batch(spark, source, archive, name, members, cutoff)
            if name != "staged":
                archive.seal(manifest)
            if name == "mid-publish":
                publish_killed_after_two_files(archive, name, monkeypatch)
                assert archive.published_files("messages", name)
                assert not (archive.batches / f"{name}.json").exists()
            if name == "published":
                archive.publish(name)  # files and manifest in place, the store not yet cleaned
        assert snapshot(url) == before
        result = run_archive(spark, source, archive.root, timedelta(hours=1), batch_size=10, now=NOW)
        assert (result.discarded_batches, result.recovered_batches) == (1, 2)
        assert_nothing_lost_nothing_duplicated(before, snapshot(url), archive.root, cutoff)
        assert all(m.settled for m in archive.manifests())
