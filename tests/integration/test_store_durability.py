"""The embedded SQLite store keeps what it answered: a commit survives a power loss."""

from __future__ import annotations

from openhub.testing import LocalHub
from tests.support.process_store import get_engine


def test_sqlite_store_syncs_every_commit() -> None:
    # WAL with synchronous=NORMAL may roll back the last commits on power loss: an "accepted"
    # message or an OK ext-call record could vanish and the call be made again.
    with LocalHub("tests.support.routes"):
        with get_engine().connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
