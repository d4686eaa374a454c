"""The hub a process serves: its settings, its routes, where it publishes, and its clock, as one object.

Drivers build one and pass it in: the Celery worker and beat (tasks/) and the HTTP API take the
process's own (`current()`, built from the OPENHUB_* environment); `openhub.testing.LocalHub` builds
its own from its settings and `install`s it while it is open, so nothing is reset through environment
variables. The hub owns its database (`Hub.transaction`, on its settings' URL) and travels with every
transaction that writes message state (`lifecycle.Tx.hub`): the engine and the service read the hub they
are given, never the process's globals (tests/unit/test_layers.py). Code that does not take the hub as a
parameter yet reads the installed one's parts through `config.get_settings()` and `registry.get_registry()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from sqlalchemy import Connection

from openhub.celery.dispatch import CeleryPublisher, Publisher
from openhub.core.config import Settings, get_settings, serve_settings
from openhub.core.registry import Registry, build_registry, get_registry, serve_registry
from openhub.store.db import reading, store_now, transaction


@dataclass(frozen=True)
class Hub:
    """What travels together from a driver into the library: settings, registry, publisher, clock."""

    settings: Settings
    registry: Registry
    publisher: Publisher
    clock: Callable[[], datetime] = field(default=store_now)  # the database's on PostgreSQL (openhub.store.db)

    def __post_init__(self) -> None:
        # The clock of this hub's database (also after `dataclasses.replace` gave it other settings).
        if self.clock is store_now or (isinstance(self.clock, partial) and self.clock.func is store_now):
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

    def reading(self) -> AbstractContextManager[Connection]:
        """A transaction on this hub's database that only reads (`openhub.store.db.reading`)."""
        return reading(self.settings.database_url)


_installed: Hub | None = None


def current() -> Hub:
    """The installed hub, else the process's own: its settings and routes from the environment
    (read once; `config.reset_settings`, `registry.reset_registry` forget them), publishing to Celery."""
    if _installed is not None:
        return _installed
    settings = get_settings()
    return Hub(settings, get_registry(), CeleryPublisher(settings))


def given(hub: Hub | None) -> Hub:
    """`hub`, else the process's (`current()`): the default of the library's entry points (`run_steps`,
    `run_batch`, `intake.prepare`) for a caller that has no hub at hand (tests, the Python API)."""
    return hub if hub is not None else current()


@contextmanager
def install(hub: Hub) -> Iterator[Hub]:
    """Serve `hub` in this process inside the block (what `current()`, `get_settings()` and
    `get_registry()` answer), then the one before."""
    global _installed
    previous, _installed = _installed, hub
    serve_settings(hub.settings)
    serve_registry(hub.registry)
    try:
        yield hub
    finally:
        _installed = previous
        serve_settings(previous.settings if previous is not None else None)
        serve_registry(previous.registry if previous is not None else None)
