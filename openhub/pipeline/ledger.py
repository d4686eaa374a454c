"""The archive directory and the protocol that makes an archive batch all-or-nothing on disk.

Layout of an archive directory `OUT`:

    OUT/messages/date=YYYY-MM-DD/route=svc.op/<batch>-part-….parquet   (also ext_calls/,
    OUT/_staging/<batch>/<table>/…   a batch being written               transitions/,
    OUT/_staging/<batch>/READY.json  the batch is complete in staging    confirmations/)
    OUT/_batches/<batch>.json        the batch is published (its manifest)
    OUT/.lock                        held by the one archive job writing here

A batch goes: Spark writes it under `_staging/<batch>/` → `seal` writes READY.json (what the
batch holds, read back from the files themselves) → `publish` renames each file into the table
directories and then writes the manifest → the database rows are deleted → the manifest is
marked settled. A crash before READY leaves only staging debris, which is discarded (the rows are
still in the database and go into a later batch). A crash after READY is rolled forward. Renames
within one filesystem are atomic, and readers (Spark) skip `_`- and `.`-prefixed paths, so a
reader never sees half a file nor a staged batch.

`--out` must therefore be a local (or shared POSIX) filesystem, not an object store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openhub.core.errors import OpenHubError

ARCHIVED_TABLES = ("messages", "ext_calls", "transitions", "confirmations", "http_exchanges", "waits")
DEPENDANT_TABLES = ARCHIVED_TABLES[1:]


@dataclass
class Manifest:
    """What one batch holds: each message's version and family, and every dependant row id."""

    batch: str
    cutoff: str
    # [id, root id, depth in its family, updated_at ISO, state] per archived message.
    messages: list[list[Any]]
    # table -> [[row id, message id], ...] for each of DEPENDANT_TABLES.
    rows: dict[str, list[list[int]]]
    withdrawn: list[int] = field(default_factory=list)
    settled: bool = False

    def __post_init__(self) -> None:
        # A batch written before a table was archived (http_exchanges, waits) simply holds none of its rows.
        for table in DEPENDANT_TABLES:
            self.rows.setdefault(table, [])

    def as_json(self) -> str:
        """The manifest as JSON text."""
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read a manifest (or a READY file, which has the same shape)."""
        return cls(**json.loads(path.read_text()))

    def archived_ids(self) -> list[int]:
        """Ids of the messages the archive holds from this batch (withdrawn ones excluded)."""
        withdrawn = set(self.withdrawn)
        return [m[0] for m in self.messages if m[0] not in withdrawn]


def write_atomically(path: Path, content: str) -> None:
    """Replace `path` with `content` so that a crash leaves the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ArchiveDir:
    """An archive directory and the moves of its batches between staging and published."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = root / "_staging"
        self.batches = root / "_batches"

    def prepare(self) -> None:
        """Create the directory skeleton."""
        for directory in (self.root, self.staging, self.batches):
            directory.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's lock: two archive jobs writing one directory would race."""
        self.prepare()
        with open(self.root / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OpenHubError(f"another archive job is writing to {self.root}") from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def stage_path(self, batch: str, table: str) -> Path:
        """Where Spark writes `table` of `batch`."""
        return self.staging / batch / table

    def staged_files(self, batch: str, table: str) -> list[Path]:
        """The Parquet files of a staged table (Spark's hidden .crc and _SUCCESS files excluded)."""
        base = self.stage_path(batch, table)
        return sorted(p for p in base.rglob("*.parquet") if not p.name.startswith((".", "_")))

    def published_files(self, table: str, batch: str | None = None) -> list[Path]:
        """Published Parquet files of `table`, all or those of one batch."""
        base = self.root / table
        pattern = f"{batch}-*.parquet" if batch else "*.parquet"
        return sorted(p for p in base.rglob(pattern) if not p.name.startswith((".", "_")))

    def seal(self, manifest: Manifest) -> None:
        """Mark a staged batch complete: from here on it is rolled forward, never discarded."""
        write_atomically(self.staging / manifest.batch / "READY.json", manifest.as_json())

    def publish(self, batch: str) -> Manifest:
        """Move a sealed batch's files into place, then write its manifest (idempotent)."""
        ready = Manifest.load(self.staging / batch / "READY.json")
        final = self.batches / f"{batch}.json"
        if not final.exists():
            for table in ARCHIVED_TABLES:
                for path in self.staged_files(batch, table):
                    relative = path.parent.relative_to(self.stage_path(batch, table))
                    target_dir = self.root / table / relative
                    target_dir.mkdir(parents=True, exist_ok=True)
                    os.replace(path, target_dir / f"{batch}-{path.name}")
                    _fsync_dir(target_dir)
            write_atomically(final, ready.as_json())
        shutil.rmtree(self.staging / batch, ignore_errors=True)
        return Manifest.load(final)

    def save(self, manifest: Manifest) -> None:
        """Rewrite a published batch's manifest (withdrawn ids, settled flag)."""
        write_atomically(self.batches / f"{manifest.batch}.json", manifest.as_json())

    def manifests(self) -> list[Manifest]:
        """Every published batch, oldest first."""
        return [Manifest.load(p) for p in sorted(self.batches.glob("*.json"))]

    def recover_staging(self) -> tuple[list[str], list[str]]:
        """Finish what a killed run left in staging: publish sealed batches, discard the rest."""
        published, discarded = [], []
        for directory in sorted(p for p in self.staging.iterdir() if p.is_dir()):
            if (directory / "READY.json").exists():
                self.publish(directory.name)
                published.append(directory.name)
            else:
                shutil.rmtree(directory)
                discarded.append(directory.name)
        return published, discarded

    def withdraw(self, batch: str, message_ids: set[int]) -> None:
        """Remove `message_ids` (and their rows) from a published batch's files.

        Used when a message changed in the database after it was archived (an operator
        restarted it): the live row wins and the stale copy must not stay in the archive.
        Each file is rewritten atomically, so a repeated withdrawal is harmless.
        """
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        ids = pa.array(sorted(message_ids), pa.int64())
        for table in ARCHIVED_TABLES:
            key = "id" if table == "messages" else "message_id"
            for path in self.published_files(table, batch):
                # ParquetFile, not read_table: the latter would add the date/route directory
                # names as columns, and writing those back would clash with Spark's partitions.
                data = pq.ParquetFile(path).read()
                kept = data.filter(pc.invert(pc.is_in(data[key], value_set=ids)))
                if kept.num_rows == data.num_rows:
                    continue
                if kept.num_rows == 0:
                    os.remove(path)
                else:
                    tmp = path.with_name(f".{path.name}.tmp")
                    pq.write_table(kept, tmp)
                    os.replace(tmp, path)
                _fsync_dir(path.parent)
