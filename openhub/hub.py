"""The hub a process serves: its settings, its routes, where it publishes, and its clock, as one object.

Drivers build one and pass it in: the Celery worker and beat (tasks/) and the HTTP API take the
process's own (`current()`, built from the OPENHUB_* environment); `openhub.testing.LocalHub` builds
its own from its settings and `install`s it while it is open, so nothing is reset through environment
variables. Code that does not take the hub as a parameter yet reads the installed one's parts through
`config.get_settings()` and `registry.get_registry()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from .config import Settings, get_settings, serve_settings
from .db import store_now
from .dispatch import CeleryPublisher, Publisher
from .registry import Registry, build_registry, get_registry, serve_registry


@dataclass(frozen=True)
class Hub:
    """What travels together from a driver into the library: settings, registry, publisher, clock."""

    settings: Settings
    registry: Registry
    publisher: Publisher
    clock: Callable[[], datetime] = field(default=store_now)  # the database's on PostgreSQL (openhub.db)

    @classmethod
    def build(cls, settings: Settings, publisher: Publisher | None = None) -> Hub:
        """The hub `settings` describe: their route modules loaded, publishing to Celery unless told."""
        return cls(settings, build_registry(settings.routes, settings),
                   publisher if publisher is not None else CeleryPublisher(settings))


_installed: Hub | None = None


def current() -> Hub:
    """The installed hub, else the process's own: its settings and routes from the environment
    (read once; `config.reset_settings`, `registry.reset_registry` forget them), publishing to Celery."""
    if _installed is not None:
        return _installed
    settings = get_settings()
    return Hub(settings, get_registry(), CeleryPublisher(settings))


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
