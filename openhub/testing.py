"""Helpers for testing routes.

`LocalHub` runs routes in this process on a temporary SQLite store, one chain after another,
with time passed in to the poller instead of slept:

    with LocalHub("routes.customers") as hub:
        view = hub.submit("customer.setCustomer", {"externalCustomerId": "42"})
        hub.run()                                  # carry every published chain to its end
        hub.tick(seconds=60)                       # the poller, a minute from now (not from the last tick)
        assert hub.get(view.id).state == "OK"

`ExternalSystem` (openhub.external_system, imported from here as well) is a real HTTP external system with
counters and failure injection, which the routes under test can call.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from contextlib import ExitStack, suppress
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Sequence

from openhub.external_system import Call, ExternalSystem

if TYPE_CHECKING:
    from openhub.celery.dispatch import Chain
    from openhub.engine.hub import Hub

__all__ = ["Call", "ExternalSystem", "LocalHub", "LocalPublisher"]


class LocalPublisher:
    """The publisher of `LocalHub`'s hub: published chains wait in `chains`, in
    the order they were published, for `LocalHub.run`; no broker to restore deliveries to and no worker to
    ping. `LocalHub.lose_broker` empties it as a broker restarted empty would be.

    Confirmations are sent at once by whoever finished the message (and by the poller's tick), unless
    `confirm_tasks` is set: then, as on Celery, each message's go to a task of its own (`openhub.confirm`),
    which waits in `confirmations` for `LocalHub.run`, and the tick hands due ones over to such tasks."""

    def __init__(self) -> None:
        self.chains: deque[Chain] = deque()
        self.emptied = False  # lost its chains, and the poller has not seen it yet
        self.confirm_tasks = False
        self.confirmations: deque[int] = deque()  # messages whose confirmation task waits (`confirm_tasks`)

    def publish_many(self, chains: Sequence[Chain]) -> set[int]:
        self.chains.extend(chains)
        return {chain[1] for chain in chains}

    def take(self) -> Chain:
        """The next chain a worker would take: the first of the highest priority (as a broker's priority
        queue gives them)."""
        first = max(self.chains, key=lambda chain: chain[5] if chain[5] is not None else -1)
        self.chains.remove(first)
        return first

    def publish_confirmation(self, message_id: int) -> bool:
        if self.confirm_tasks:
            self.confirmations.append(message_id)
        return self.confirm_tasks

    def restore_orphans(self, dead: Collection[str]) -> int:
        return 0

    def broker_marked(self) -> bool | None:
        return not self.emptied

    def mark_broker(self) -> None:
        self.emptied = False

    def waiting_chains(self, queues: Collection[str | None]) -> set[tuple[int, str]] | None:
        return {(chain[1], chain[2]) for chain in self.chains}

    def ping_workers(self, timeout: float) -> list[str] | None:
        return None


class _Reads(dict[str, str]):
    """An environment that remembers the names looked up in it (the ones the settings read)."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)


SCRATCH = "/dev/shm"  # a RAM file system, where Linux has one
SCRATCH_ROOM = 1 << 30  # the room left there that LocalHub wants (a container's may be 64 MB only)


def _scratch() -> str | None:
    """Where LocalHub makes its store: in memory (SCRATCH) where there is one with room, unless TMPDIR says
    where temporary files go; else the system's temporary directory (None).

    The store is thrown away with the hub, yet every commit waits for its WAL to reach the disk (PRAGMA
    synchronous=FULL, openhub.store.db): on a busy disk 1 to 5 ms a commit, on a RAM file system under 0.1 ms,
    for the same SQLite, pragmas and statements. A test of a few hundred commits hardly notices; the promise
    model (about 570 commits an example, 100 examples in CI) spent most of its time waiting for them."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        room = os.statvfs(SCRATCH)
    except OSError:
        return None
    enough = room.f_bavail * room.f_frsize >= SCRATCH_ROOM
    return SCRATCH if enough and os.path.isdir(SCRATCH) and os.access(SCRATCH, os.W_OK | os.X_OK) else None


_MIGRATED: dict[int, Path] = {}  # process -> a new store it brought to the schema's head, kept to copy


def _migrated(db: Path) -> None:
    """Bring LocalHub's new SQLite store at `db` to the schema's head: the first in this process by its
    migrations, each later one by a copy of what they made (the same schema and alembic revision). Running
    the migrations again took half a second per LocalHub; the promise model opens one per example."""
    import atexit
    import sqlite3
    from contextlib import closing

    from openhub.store.migrate import upgrade

    template = _MIGRATED.get(os.getpid())
    if template is None:
        upgrade(f"sqlite:///{db}")
        folder = Path(tempfile.mkdtemp(prefix="openhub-local-schema-", dir=_scratch()))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        source, target = db, folder / "openhub.db"
        _MIGRATED[os.getpid()] = target
    else:
        source, target = template, db
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)  # a consistent copy, WAL or not


class LocalHub:
    """A hub in this process: a temporary SQLite store, chains run in order, no broker, no worker.

    For testing routes: steps run exactly as a worker runs them (claim, ext-call guard, outcome,
    retry), but one at a time and only when `run()` or `tick()` says so.
    """

    def __init__(self, routes: str, source_system: str = "TEST", **settings: str) -> None:
        self.routes = routes
        self.source_system = source_system
        self.settings = settings
        self._dir: Path | None = None
        self._saved: dict[str, str] = {}
        self._theirs: tuple[str, ...] = ()
        self.hub: Hub | None = None  # the hub it serves while open (openhub.engine.hub)
        self._count = 0
        self.publisher = LocalPublisher()  # the chains published and not yet run
        self._installed = ExitStack()

    def __enter__(self) -> "LocalHub":
        from openhub.core.config import Settings
        from openhub.engine.hub import Hub, install
        from openhub.store.db import dispose_engines
        from openhub.store.migrate import upgrade
        from openhub.store.workers import beat, current_id

        self._dir = Path(tempfile.mkdtemp(prefix="openhub-local-", dir=_scratch()))
        store = f"sqlite:///{self._dir / 'openhub.db'}"
        env = _Reads(
            {
                **os.environ,
                "OPENHUB_DATABASE_URL": store,
                "OPENHUB_ROUTES": self.routes,
                "OPENHUB_VAR_DIR": str(self._dir),
                **self.settings,
            }
        )
        settings = Settings.from_env(env)
        # The hub's own settings are its own; what else was given (the variables a route module reads,
        # such as OPENHUB_EXAMPLE_URL) can only reach the routes through the environment.
        theirs = {k: v for k, v in self.settings.items() if k not in env.read}
        self._saved = {k: os.environ[k] for k in theirs if k in os.environ}
        self._theirs = tuple(theirs)
        os.environ.update(theirs)
        self.hub = Hub.build(settings, self.publisher)
        dispose_engines()
        self._installed.enter_context(install(self.hub))
        if settings.database_url == store:  # its own new store (not one given in OPENHUB_DATABASE_URL)
            _migrated(self._dir / "openhub.db")
        else:
            upgrade(settings.database_url)
        self.publisher.chains.clear()
        # Steps run in this process: it is the one worker, alive as long as the hub is open (in its own store).
        beat(current_id(), "LocalHub", settings.database_url)
        return self

    def __exit__(self, *_: object) -> None:
        from openhub.store.db import dispose_engines

        self._installed.close()
        dispose_engines()
        for key in self._theirs:
            os.environ.pop(key, None)
        os.environ.update(self._saved)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def submit(self, route: str, payload: Any, correlation_id: str | None = None, **kwargs: Any) -> Any:
        """Accept a message as `openhub.submit` does (its chain waits for `run()`)."""
        from openhub.service.messages import submit

        self._count += 1
        return submit(
            route,
            payload,
            source_system=kwargs.pop("source_system", self.source_system),
            correlation_id=correlation_id or f"local-{self._count}",
            hub=self.hub,
            **kwargs,
        )

    def run(self, limit: int = 10_000, seconds: float = 0.0) -> int:
        """Run every published chain (and the chains they publish) to its end, `seconds` from now;
        returns how many."""
        from openhub.celery import dispatch
        from openhub.engine.batch import run_batch
        from openhub.engine.engine import run_steps
        from openhub.outbound.confirm import send_confirmations
        from openhub.store.db import store_now

        assert self.hub is not None, "run() inside `with LocalHub(...)`"
        url = self.hub.settings.database_url

        def clock() -> Any:
            return store_now(url) + timedelta(seconds=seconds)

        self.hub.refresh()  # live settings on the hub itself: its per-run copy below would swap them anew each run
        hub = replace(self.hub, clock=clock)

        done = 0
        while self.publisher.chains and done < limit:
            route, message_id, token, start, _trace, _priority = self.publisher.take()
            if route.batch:  # with those of the same route and first step published since, as a worker would
                pairs = [(message_id, token)] + self._take_batch(route.name, start, route.batch - 1)
                try:
                    run_batch(route.name, start, pairs, hub=hub)
                except BaseException:
                    self._crashed()
                    raise
                done += len(pairs)
                continue
            for index in dispatch.task_starts(route, start):  # task by task, as the workers would
                try:
                    report = run_steps(route.name, index, dispatch.task_end(route, index), message_id, token, hub=hub)[
                        1
                    ]
                except BaseException:
                    self._crashed()
                    raise
                if not report:
                    break
            done += 1
        while self.publisher.confirmations:  # the `openhub.confirm` tasks (`LocalPublisher.confirm_tasks`)
            send_confirmations(
                self.publisher.confirmations.popleft(), now=clock(), settings=hub.settings, registry=hub.registry
            )
        return done

    def lose_broker(self) -> None:
        """The broker restarts empty (or is flushed): every chain and confirmation task published and not yet
        run is lost."""
        self.publisher.chains.clear()
        self.publisher.confirmations.clear()
        self.publisher.emptied = True

    def _crashed(self) -> None:
        """A run crashed mid-step (a BaseException out of it, Ctrl-C): this process's heartbeat says so, as
        a live worker's next one would. The row written when the hub opened vouched for every run begun
        after it: the run stayed leased while the hub was open. Now the next tick repairs it."""
        from openhub.store.workers import beat, current_id

        assert self.hub is not None
        with suppress(Exception):  # the store away too: the crash is what is raised
            beat(current_id(), "LocalHub", self.hub.settings.database_url)

    def _take_batch(self, route: str, start: int, size: int) -> list[tuple[int, str]]:
        """Up to `size` of the waiting chains of `route` from step `start`, taken out of the line."""
        taken = [c for c in self.publisher.chains if c[0].name == route and c[3] == start][:size]
        for chain in taken:
            self.publisher.chains.remove(chain)
        return [(chain[1], chain[2]) for chain in taken]

    def tick(self, seconds: float = 0.0) -> Any:
        """One poller tick `seconds` from now, then run what it re-drove at that time too; returns the
        tick's report.

        `seconds` counts from the hub's clock's now, not from the last tick: the hub has no clock of its
        own that ticks move on. `tick(seconds=31)` twice is two ticks half a minute ahead, never one a
        minute ahead; to be past a 60 s retry, `tick(seconds=61)`. (`run(seconds=...)` alike.)"""
        from openhub.engine.poller import tick
        from openhub.store.db import store_now

        assert self.hub is not None, "tick() inside `with LocalHub(...)`"
        report = tick(self.hub, store_now(self.hub.settings.database_url) + timedelta(seconds=seconds))
        self.run(seconds=seconds)
        return report

    def get(self, message_id: int) -> Any:
        """The message as the store holds it."""
        from openhub.service.reads import get_message

        return get_message(message_id, hub=self.hub)
