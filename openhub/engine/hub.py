"""The hub a process serves: its settings, its routes, where it publishes, and its clock, as one object.

Drivers build one and pass it in: the Celery worker and beat (tasks/) and the HTTP API take the
process's own (`current()`, built from the OPENHUB_* environment); `openhub.testing.LocalHub` builds
its own from its settings and `install`s it while it is open, so nothing is reset through environment
variables. Building a hub (`Hub.build`) writes no process global: only a driver's explicit `install` makes
a hub the process's, and hubs installed side by side (two LocalHubs) may close in any order. The hub owns
its database (`Hub.transaction`, on its settings' URL) and travels with every transaction that writes
message state (`lifecycle.Tx.hub`): the engine and the service read the hub they are given, never the
process's globals (tests/unit/test_layers.py, whose DEFINED_AT names the only places below the drivers that
call them: `current()` and `given()` here, `registry.get_registry()`, where they are defined).

`settings` is the one part of a hub that changes while it serves: `Hub.refresh()` applies the values an admin
set at run time (openhub.core.live, kept by openhub.store.live) on top of the settings its driver built, at
most every half poll interval per process, from the entry points that take the hub (a step run, a batch, a
poller tick, a submission, an API request). No thread of its own: it works alike in a prefork child, under
gevent and in a LocalHub.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from sqlalchemy import Connection

from openhub.celery.dispatch import CeleryPublisher, Publisher
from openhub.core import live
from openhub.core.config import Settings, get_settings, serve_settings, swap_settings
from openhub.core.registry import Registry, build_registry, get_registry, serve_registry
from openhub.store import live as live_store
from openhub.store.db import reading, single_statement, store_now, transaction

log = logging.getLogger("openhub.config")


def _its_stores() -> datetime:
    """A hub's default clock: its store's, set when it is built (`Hub.__post_init__`)."""
    raise AssertionError("a hub's default clock is replaced by its store's when it is built")


@dataclass(frozen=True)
class Hub:
    """What travels together from a driver into the library: settings, registry, publisher, clock."""

    settings: Settings
    registry: Registry
    publisher: Publisher
    clock: Callable[[], datetime] = field(default=_its_stores)  # the database's on PostgreSQL (openhub.store.db)

    def __post_init__(self) -> None:
        # The clock of this hub's database (also after `dataclasses.replace` gave it other settings).
        if self.clock is _its_stores or (isinstance(self.clock, partial) and self.clock.func is store_now):
            object.__setattr__(self, "clock", partial(store_now, self.settings.database_url))

    @classmethod
    def build(cls, settings: Settings, publisher: Publisher | None = None) -> Hub:
        """The hub `settings` describe: their route modules loaded, publishing to Celery unless told."""
        return cls(
            settings,
            build_registry(settings.routes, settings),
            publisher if publisher is not None else CeleryPublisher(settings),
        )

    def transaction(self, *, first: bool = False) -> AbstractContextManager[Connection]:
        """One transaction on this hub's database (`openhub.store.db.transaction` on its settings' URL)."""
        return transaction(self.settings.database_url, first=first)

    def single_statement(self) -> AbstractContextManager[Connection]:
        """One statement that is its own transaction on this hub's database (`openhub.store.db.single_statement`)."""
        return single_statement(self.settings.database_url)

    def reading(self) -> AbstractContextManager[Connection]:
        """A transaction on this hub's database that only reads (`openhub.store.db.reading`)."""
        return reading(self.settings.database_url)

    def refresh(self, *, force: bool = False, record: bool = True) -> Settings:
        """The settings in force: the store's live values on top of the driver's settings, read at most every
        half poll interval in this process (`force`: now). A change is swapped in (`settings`, the process's
        `get_settings()` where it answered the old object, the stock webhook's states, the log level). The
        store away keeps the settings in force (logged once): a step never fails for it. `record`: whether this
        call may write the process's snapshot (never from inside a transaction that may hold the store: on
        SQLite, the one writer would be waiting for itself)."""
        seen = _seen.get(self.settings.database_url) or _seen.setdefault(self.settings.database_url, _Seen())
        clock = time.monotonic()
        if force or clock >= seen.next_read:
            seen.next_read = clock + self.settings.poll_interval.total_seconds() / 2
            try:
                with self.reading() as conn:
                    seen.overrides = tuple(sorted(live.usable(live_store.overrides(conn)).items()))
                seen.away = False
            except Exception as exc:
                if not seen.away:
                    log.warning("live settings not read, the ones in force are kept: %s", exc)
                seen.away = True
        if seen.overrides is not None and self.settings.live_overrides != seen.overrides:  # both sorted pairs
            self._swap(live.with_overrides(live.driver_settings(self.settings), dict(seen.overrides)))
        if record and _kind is not None and seen.shown != (_kind, self.settings.live_overrides):
            seen.shown = (_kind, self.settings.live_overrides) if self._snapshot(_kind) else None
        return self.settings

    def _swap(self, new: Settings) -> None:
        old = self.settings
        object.__setattr__(self, "settings", new)  # a frozen dataclass: settings is the one part that changes
        swap_settings(old, new)
        live.apply(old, new, self.registry)
        log.info("live settings in force: %s", dict(new.live_overrides) or "none (environment and defaults)")

    def _snapshot(self, kind: str) -> bool:
        """Keep this process's settings in force as its kind's newest; whether it was written."""
        try:
            with self.transaction() as conn:
                node = f"{socket.gethostname()}:{os.getpid()}"  # a prefork child's own, not its parent's
                live_store.snapshot(conn, kind, node, live.in_force(self.settings, os.environ), self.clock())
        except Exception as exc:
            log.debug("settings snapshot not written: %s", exc)
            return False
        return True


@dataclass
class _Seen:
    """What this process last read of one database's live values, and when it reads them next."""

    overrides: tuple[tuple[str, str], ...] | None = None  # sorted, as Settings.live_overrides
    next_read: float = 0.0
    away: bool = False  # the last read failed (logged once)
    shown: tuple[str, tuple[tuple[str, str], ...]] | None = None  # the snapshot written last: kind, values


_seen: dict[str, _Seen] = {}  # by database URL
_kind: str | None = None  # api, worker or beat: the process kind whose snapshot this process writes


def serve_as(kind: str) -> None:
    """Name this process's kind (the drivers: the API app, the Celery worker, beat): its hubs keep a
    snapshot of their settings in force for `openhub config`. A process without one (the CLI, a test's
    LocalHub) writes none."""
    global _kind
    _kind = kind


_installed: list[Hub] = []  # the hubs drivers installed and whose blocks are still open, oldest first


def current() -> Hub:
    """The process's hub: the one a driver installed last whose block is still open, else the process's
    own, its settings and routes from the environment (read once; `config.reset_settings`,
    `registry.reset_registry` forget them), publishing to Celery."""
    if _installed:
        return _installed[-1]
    settings = get_settings()
    return Hub(settings, get_registry(), CeleryPublisher(settings))


def given(hub: Hub | None) -> Hub:
    """`hub`, else the process's (`current()`): the default of the library's entry points (`run_steps`,
    `run_batch`, `intake.prepare`) for a caller that has no hub at hand (tests, the Python API)."""
    return hub if hub is not None else current()


@contextmanager
def install(hub: Hub) -> Iterator[Hub]:
    """Make `hub` the process's inside the block (what `current()`, `get_settings()` and `get_registry()`
    answer): a driver's explicit act, never a side effect of building a hub (`Hub.build` writes nothing).
    The library below the drivers reads the hub it is given, not this one (tests/unit/test_layers.py).

    Blocks may end in any order (two LocalHubs, the first closed while the second is still open): the
    process's hub is always the newest installed whose block is still open, else the environment's;
    never one whose block ended, and never one hub's settings or routes served beside another's."""
    _installed.append(hub)
    _serve()
    try:
        yield hub
    finally:
        del _installed[max(i for i, h in enumerate(_installed) if h is hub)]
        _serve()


def _serve() -> None:
    """Answer the process's hub's settings and routes from `get_settings()`/`get_registry()`."""
    served = _installed[-1] if _installed else None
    serve_settings(served.settings if served is not None else None)
    serve_registry(served.registry if served is not None else None)
