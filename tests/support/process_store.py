"""The store of the hub this test process serves (the LocalHub opened last, else the environment's), for tests:
`openhub.store.db` takes the URL of the hub a caller has in hand and reads no process settings (issue 35);
a test that works on whatever store the process's hub has takes these, whose URL left out is that store's."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine

from openhub.engine.hub import current
from openhub.store import db


def process_url() -> str:
    """The database URL of the process's hub."""
    return current().settings.database_url


def transaction(
    url: str | None = None, *, first: bool = False, read_only: bool = False
) -> AbstractContextManager[Connection]:
    """`openhub.store.db.transaction` on `url`, else on the process's hub's store."""
    return db.transaction(url or process_url(), first=first, read_only=read_only)


def reading(url: str | None = None) -> AbstractContextManager[Connection]:
    """`openhub.store.db.reading` on `url`, else on the process's hub's store."""
    return db.reading(url or process_url())


def store_now(url: str | None = None) -> datetime:
    """`openhub.store.db.store_now` of `url`, else of the process's hub's store."""
    return db.store_now(url or process_url())


def get_engine(url: str | None = None) -> Engine:
    """`openhub.store.db.get_engine` of `url`, else of the process's hub's store."""
    return db.get_engine(url or process_url())


def forbid_process_settings(monkeypatch: Any) -> None:
    """From now on (until `monkeypatch.undo()`), reading the process's settings (`get_settings()`, anywhere)
    fails the test: what a hub's path must not do (tests/unit/test_layers.py)."""
    from openhub.core import config

    def unreadable(*_: object, **__: object) -> None:
        raise AssertionError("the process's settings were read on a hub's path")

    monkeypatch.setattr(config, "_served", None)
    monkeypatch.setattr(config, "_settings", None)
    monkeypatch.setattr(config.Settings, "from_env", classmethod(unreadable))
