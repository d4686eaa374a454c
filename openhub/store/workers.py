"""Worker liveness: each process that runs steps keeps a heartbeat row, and a stale one is dead.

A step's lease names the process running it (`messages.worker`), and each heartbeat lists the
step runs in flight in that process. The poller repairs at once a run whose process is dead, or
whose live process no longer lists it (its task crashed), and extends the lease of a listed run
however long its step takes: a killed worker's messages are back in seconds and a merely slow
step is never run twice.

A heartbeat also stops when the database is away, so "dead" needs a witness: a process is dead
only when another process kept heartbeating without a break for `OPENHUB_WORKER_DEAD_AFTER`
after its last heartbeat. The database was there all that time, and the silent process did not
use it. After an outage every process starts a new unbroken run, and nobody is declared dead
until one of them has lasted that long.

Liveness is judged on one clock: on PostgreSQL a heartbeat's times are the database server's, so a
host whose clock is off neither sees the others dead nor looks dead itself. And a process judges
itself before others may: once its own heartbeat is older than 3/4 of the dead-after limit (a stall,
a store it cannot reach), it starts no step call on a lease it holds, nor on one it took before
that gap (`fenced`), so a repair never overlaps a call of a process that was judged dead.

The heartbeat runs on a real OS thread (under gevent, one of gevent's original `_thread`), with a
connection of its own: a step that computes without yielding, a loaded machine or greenlets waiting for
the store's connections cannot stop it while the process lives (issue 33, break 5).

Each external call the hub makes or lends is fenced right before it is sent (`check_fence`): besides
the above, it is refused as soon as the heartbeat's last try failed (the store cannot be reached) or its
last success is older than `CALL_FENCE` of the dead-after limit (2.5 heartbeat intervals: a beat stuck in a
store that neither answers nor fails). A call started then could not be recorded, and the repair would
make it again (break 6); refusing it costs only a postponed step. The limit is half the dead-after limit,
not 3/4: a beat is due every fifth of it, so two missed beats are proof enough, and the half left is
what a call just started has before others may judge this process dead. A heartbeat is slow to see a cut
(a query on a cut link hangs), so a call is also sent only within `PROOF_AGE` (0.5 s) of a store round trip
of this process, or after a ping answered now (openhub.store.proof).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, delete, insert, select, update
from sqlalchemy.pool import NullPool

from openhub.core.config import Settings
from openhub.core.errors import Fenced
from openhub.store.db import database_now, is_postgres, record_proofs, sqlite_engine, transaction, utcnow
from openhub.store.holds import hold_on
from openhub.store.liveness import Liveness as Liveness  # judged there, still importable from here
from openhub.store.liveness import dead_among as dead_among
from openhub.store.proof import proved
from openhub.store.schema import workers

log = logging.getLogger("openhub.workers")
W = workers.c
FORGET_AFTER = timedelta(days=1)  # rows of processes gone this long are deleted


def _native_lock() -> Any:
    """A lock of the OS, also under gevent (whose patched locks are for greenlets of one thread): what the
    heartbeat thread and the steps' greenlets share, held by neither across I/O (a greenlet blocked on it
    blocks its whole thread)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original("_thread", "allocate_lock")()
    return threading.Lock()


_lock = threading.Lock()  # greenlets' own under gevent: held across the first heartbeat's I/O, never by the thread
_current: tuple[int, str] | None = None  # (pid, worker id) of this process
_beating: int | None = None  # pid whose heartbeat thread runs
_heart: _Heart | None = None  # that thread
_runs: set[str] = set()  # the step runs in flight in this process
_started = 0  # how many step runs this process started: a run's id begins with its number
_runs_lock = _native_lock()  # a heartbeat reads `_started` and `_runs` as of one moment
FENCE = 0.75  # of OPENHUB_WORKER_DEAD_AFTER: a heartbeat this old stops this process's step calls
_renewed: float | None = None  # monotonic time just before this process's last heartbeat that was written
_gap_ended = float("-inf")  # monotonic time its heartbeat was last written after a gap longer than the fence
_store_away = False  # this process's last heartbeat failed: the store could not be reached
CALL_FENCE = 0.5  # of OPENHUB_WORKER_DEAD_AFTER: a heartbeat this old refuses an external call (module doc)
_consumer = False  # this process is a worker's main process: it takes the broker's tasks (start_heartbeat)
_held: str | None = None  # why an operator holds it (openhub.store.holds), as its last heartbeat read
# The settings its driver started this process's heartbeat with (`start_heartbeat`): its store, its dead-after
# limit (a restart's, not live), so its fence and interval; None: it does not heartbeat.
_settings: Settings | None = None
# The step run in hand: [when its lease was taken, whether a call of it was refused]
_lease_since: ContextVar[list[Any] | None] = ContextVar("openhub_lease_since", default=None)


@contextmanager
def running() -> Iterator[str]:
    """A new step run's id, listed in this process's heartbeat while the block runs (from before its
    lease is taken until its outcome is recorded, or its task crashed).

    The id begins with the run's number in this process (`<n>.<random>`), and each heartbeat says up
    to which number it has seen (`#<n>` in its runs), so the poller tells a run begun after the last
    heartbeat from one that heartbeat left out (its task crashed) without comparing the lease's time,
    written by the worker's clock, with the heartbeat's, the database's: a worker whose clock is
    behind would otherwise see its new runs repaired while they call.
    """
    global _started
    current_id()
    with _runs_lock:
        _started += 1
        run_id = f"{_started}.{uuid.uuid4().hex[:24]}"
        _runs.add(run_id)
    try:
        yield run_id
    finally:
        _runs.discard(run_id)


def _locks_anew() -> None:
    """In a forked child: fresh locks. A child forked while its parent's heartbeat thread held one
    (prefork replaces a child at any moment) would wait for it forever in its first step."""
    global _lock, _runs_lock, _consumer, _held
    _lock, _runs_lock = threading.Lock(), _native_lock()
    _consumer, _held = False, None  # a pool process takes nothing from the broker: no hold is its to read


os.register_at_fork(after_in_child=_locks_anew)


def current_id() -> str:
    """This process's worker id (a new one after a fork: a child is a worker of its own)."""
    global _current
    pid = os.getpid()
    if _current is None or _current[0] != pid:
        with _lock:
            if _current is None or _current[0] != pid:
                _current = (pid, str(uuid.uuid4()))
                _runs.clear()  # a forked child runs none of its parent's steps
    return _current[1]


def current_node() -> str:
    """This process as people know it: host:pid (the heartbeat's node, an attempt's worker)."""
    return f"{socket.gethostname()}:{os.getpid()}"[:255]


def start_heartbeat(settings: Settings, *, keep_trying: bool = False, consumer: bool = False) -> str:
    """Make sure this process heartbeats (once per process) in the store of `settings`, its driver's hub's, by
    their dead-after limit; returns its worker id.

    Called by the Celery adapter (tasks/, with its hub's settings) before a task runs. Processes that never call it have
    no heartbeat thread (a web app submitting; `openhub.testing.LocalHub` writes one row when it opens): a run they
    left without its outcome is repaired by the poller by the lease's expiry when they have no row, and is never
    repaired while their row lists it as in flight (a LocalHub whose run crashed writes its row again, leaving the
    run out: the next tick repairs it).
    `keep_trying` (a worker's main process, which takes no step): a first heartbeat that fails is
    not raised; the thread goes on trying, and the store counts as away (`store_reachable`) meanwhile.
    `consumer` (that main process): each heartbeat also reads whether an operator holds it (`held`).
    """
    global _beating, _heart, _store_away, _consumer, _settings
    worker_id = current_id()
    _consumer = _consumer or consumer
    pid = os.getpid()
    if _beating != pid or not _heart_alive():
        with _lock:
            if _beating != pid or not _heart_alive():
                if _beating == pid:
                    log.error("worker %s: its heartbeat thread ended; starting it again", worker_id)
                _settings = settings
                url = settings.database_url
                node = current_node()
                # The thread's own connection is opened here, by the first beat, before any step of this
                # process takes a lease: opened by the thread at its first beat, a loaded machine's
                # seconds of opening it fell between two beats, just as the first tasks' steps called,
                # and the fence refused those calls (the chain-gevent kill test: the killed worker then
                # held no run, and nothing was repaired as died).
                own = _OwnConnection(url)
                try:
                    beat(worker_id, node, url, broken=True, own=own)  # the first row, before any step runs
                    away = False
                except Exception as exc:
                    if not keep_trying:
                        own.dispose()
                        raise
                    log.warning("worker %s: first heartbeat failed (%s)", worker_id, exc)
                    away = True
                _store_away = away
                heart = _Heart()
                heart.start(worker_id, node, own, away)
                _beating, _heart = pid, heart
    return worker_id


def beat(
    worker_id: str,
    node: str,
    url: str | None,
    *,
    broken: bool = False,
    now: datetime | None = None,
    own: _OwnConnection | None = None,
) -> None:
    """Record one heartbeat; `broken` starts a new unbroken run (the previous beat failed).

    Its time is the database server's on PostgreSQL (`now` given: that one), so every heartbeat
    is written by one clock; SQLite is embedded, and its clock is this host's. `own`: the heartbeat
    thread's connection (no pool the steps share, no gate); else one of the pool of the store at `url`, ahead
    of the steps' greenlets.
    """
    global _renewed, _gap_ended, _held
    held = None
    if own is not None:
        opened = own.begin()
    elif url is not None:
        opened = transaction(url, first=True)
    else:
        raise TypeError("beat needs the store's `url` or the heartbeat thread's own connection")
    with opened as conn:
        # The fence counts from here, with the connection in hand, just before the heartbeat's time is read:
        # still no later than the time others see, but not charged with opening the connection, which in a
        # fresh process on a busy machine took most of the fence and fenced its first step at once.
        started = time.monotonic()
        if now is None:
            now = conn.execute(select(database_now())).scalar_one() if is_postgres(conn) else utcnow()
        with _runs_lock:  # taken after `now`: a run leased after `now` is not missing from it
            runs = ",".join([f"#{_started}", *sorted(_runs)])
        values: dict[str, Any] = {"last_seen": now, "runs": runs}
        if _consumer:  # what it says it does is what it does from this commit on (`held`)
            held = hold_on(conn, worker_id, node)
            values["taking"] = held is None
        if broken:
            values["up_since"] = now
        if conn.execute(update(workers).where(W.id == worker_id).values(**values)).rowcount == 0:
            values.setdefault("up_since", now)
            parent = f"{node.rpartition(':')[0]}:{os.getppid()}"  # its worker's main process, for a pool's
            conn.execute(insert(workers).values(id=worker_id, node=node, parent=parent, **values))
            forget_gone(conn, now)  # a process's first heartbeat clears out the long gone
    _held = held
    if _renewed is not None and started - _renewed > _fence_after():
        _gap_ended = time.monotonic()
    _renewed = started


def _fence_after() -> float:
    # No heartbeat started (a beat written by hand): nothing to fence by.
    return float("inf") if _settings is None else _settings.worker_dead_after.total_seconds() * FENCE


def call_fenced(since: float) -> bool:
    """Whether an external call of a step run whose lease was taken at `since` must not be sent now:
    `fenced`, or the heartbeat's last try failed, or its last success is older than `CALL_FENCE`, or the
    store answered none of this process's statements in the last `PROOF_AGE` and does not answer a ping
    now (openhub.store.proof: a store cut meanwhile)."""
    if _beating != os.getpid() or _renewed is None or _settings is None:
        return False
    return (
        fenced(since)
        or _store_away
        or time.monotonic() - _renewed > _settings.worker_dead_after.total_seconds() * CALL_FENCE
        or not proved(_settings.database_url)
    )


@contextmanager
def fencing(since: float) -> Iterator[None]:
    """Within the block, `check_fence` guards the calls of the step run whose lease was taken at `since`;
    where one was refused, the block raises Fenced at its end (also when the step caught it)."""
    held = [since, False]
    token = _lease_since.set(held)
    try:
        yield
    finally:
        _lease_since.reset(token)
    if held[1]:
        raise Fenced("a call of the step was refused: this process's heartbeat fell behind")


def check_fence() -> None:
    """Raise Fenced where this process must not make an external call now (`call_fenced`) for the step
    run in hand; outside a step run, for any (a confirmation, a webhook: `fencing` sets its own)."""
    held = _lease_since.get()
    if call_fenced(float("inf") if held is None else held[0]):  # outside a run: how the heartbeat is now
        if held is not None:
            held[1] = True
        raise Fenced(
            "this process's heartbeat fell behind (stalled, or the store unreachable): no external call is made"
        )


def fenced(since: float) -> bool:
    """Whether this process must not start a step call on a lease it took at monotonic time `since`:
    its heartbeat is older than the fence now, or was at some moment since (a stall, a store it could
    not reach), when others may have judged it dead and repaired the run.

    A process without a heartbeat thread (LocalHub, a web app) is never fenced.
    """
    if _beating != os.getpid() or _renewed is None:
        return False
    return time.monotonic() - _renewed > _fence_after() or _gap_ended >= since


def _heart_alive() -> bool:
    return _heart is not None and _heart.alive


def store_reachable() -> bool:
    """Whether this process's heartbeat is current (True where it does not heartbeat): its last one
    reached the store, no longer ago than the fence. A heartbeat stuck in the store (neither failed nor
    written) is a store away as well; a heartbeat thread that ended is started again.

    A worker's main process takes no task from the broker while it is False (tasks/store_gate.py).
    """
    if _beating != os.getpid():
        return True
    if not _heart_alive() and _settings is not None:
        start_heartbeat(_settings, keep_trying=True)  # a store away meanwhile: the new thread goes on trying
    return not _store_away and _renewed is not None and time.monotonic() - _renewed <= _fence_after()


def held() -> str | None:
    """Why an operator told this worker to finish what it has and take nothing new (None: it was not), as its
    last heartbeat read it (a worker's main process only: `start_heartbeat(consumer=True)`)."""
    return _held if _consumer else None


def stop_heartbeat() -> None:
    """Stop this process's heartbeat (an in-process test worker that is done); a later step starts it anew."""
    global _beating, _heart, _settings
    with _lock:
        if _heart is not None and _beating == os.getpid():
            _heart.stop(timeout=10)
        _beating, _heart, _settings = None, None, None


class _Heart:
    """The heartbeat's thread: an OS thread also under gevent (gevent's original `_thread`), which no
    greenlet that computes, and no greenlet waiting for the store, can hold back."""

    def __init__(self) -> None:
        self.alive = False
        self._stop = _native_lock()  # held while the thread should go on
        self._ended = _native_lock()  # held while the thread runs
        self._stop.acquire()

    def start(self, worker_id: str, node: str, own: _OwnConnection, broken: bool) -> None:
        monkey = sys.modules.get("gevent.monkey")
        start_new_thread = monkey.get_original("_thread", "start_new_thread") if monkey is not None else None
        if start_new_thread is None:
            import _thread

            start_new_thread = _thread.start_new_thread
        self._ended.acquire()
        self.alive = True
        try:
            start_new_thread(self._run, (worker_id, node, own, broken))
        except BaseException:
            self.alive = False
            self._ended.release()
            own.dispose()
            raise

    def stop(self, timeout: float) -> None:
        self._stop.release()
        if self._ended.acquire(timeout=timeout):
            self._ended.release()

    def _run(self, worker_id: str, node: str, own: _OwnConnection, broken: bool) -> None:
        try:
            _heartbeat(worker_id, node, own, self._stop, broken)
        finally:
            self.alive = False
            self._ended.release()


class _OwnConnection:
    """The heartbeat's own connection to the store: opened by the process's first beat (`start_heartbeat`),
    then the heartbeat thread's alone, kept between beats and opened anew after a failure."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = (
            sqlite_engine(url, poolclass=NullPool)
            if url.startswith("sqlite")
            else create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 10})
        )
        if not url.startswith("sqlite"):
            record_proofs(self.engine, url)  # a beat answered is a proof of the store (openhub.store.proof)
        self.conn: Connection | None = None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        if self.conn is None:
            self.conn = self.engine.connect()
        try:
            with self.conn.begin():
                yield self.conn
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                pass

    def dispose(self) -> None:
        self.close()
        self.engine.dispose()


def _heartbeat(worker_id: str, node: str, own: _OwnConnection, stop: Any, broken: bool = False) -> None:
    """Beat every fifth of the dead-after limit over `own` (opened by the first beat, kept between beats,
    opened anew after a failure) until `stop` is released; `own` is disposed of at the end."""
    global _store_away
    assert _settings is not None  # set by start_heartbeat before it starts this thread
    interval = max(_settings.worker_dead_after.total_seconds() / 5, 0.05)
    try:
        while not stop.acquire(timeout=interval):  # released: stop
            try:
                beat(worker_id, node, None, broken=broken, own=own)
                broken = False
            except Exception as exc:
                if not broken:
                    log.warning("worker %s: heartbeat failed (%s)", worker_id, exc)
                broken = True
            _store_away = broken
    finally:
        own.dispose()


def liveness(conn: Connection, dead_after: timedelta) -> Liveness:
    """The heartbeats as the store shows them now, a process silent for `dead_after` (the hub's
    OPENHUB_WORKER_DEAD_AFTER) dead."""
    rows = conn.execute(select(workers)).all()
    dead = dead_among(rows, dead_after)
    return Liveness({r.id: r for r in rows if r.id not in dead}, dead)


def forget_gone(conn: Connection, now: datetime) -> None:
    """Delete the rows of processes silent for a day."""
    conn.execute(delete(workers).where(W.last_seen < now - FORGET_AFTER))
