"""Connections to the message store, and the one boundary where driver errors are translated.

SQLite (the embedded default) runs in WAL mode and takes its write lock at BEGIN (BEGIN
IMMEDIATE), so concurrent worker processes queue for the lock instead of failing half-way;
PostgreSQL runs READ COMMITTED with row locks. Engines are per process: a forked worker builds
its own instead of sharing the parent's sockets. Under the gevent pool the greenlets of a process
enter the store through a gate as wide as its connection pool (one for SQLite), so they wait for
each other as greenlets, never inside SQLite's busy wait or SQLAlchemy's pool timeout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, Engine, Insert, Table, create_engine, event, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from openhub.core.concurrency import SQLITE_GATE, green, store_gate
from openhub.core.errors import StoreUnavailable

_engines: dict[tuple[int, str], Engine] = {}


# Connections per process to PostgreSQL: kept, and at most more. None beyond the kept ones: an
# overflow connection is opened for one transaction and closed after it, and on the gevent or
# threads pool, whose steps keep all of them busy, that was a new PostgreSQL session (connect,
# authenticate, fork a backend) for every other transaction (bench/RESULTS.md, issue 21).
# Prefork processes run one step at a time and open one or two either way.
PG_POOL_SIZE, PG_MAX_OVERFLOW = 10, 0
# Seconds a transaction waits for a free connection of the pool (the threads pool runs more steps than
# that at once); then the store counts as unavailable for it, and it is tried again.
PG_POOL_TIMEOUT = 30.0


def utcnow() -> datetime:
    """This host's wall clock as naive UTC, the store's convention (`store_now` is the hub's time)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


# --- the hub's clock -----------------------------------------------------------------------------------
#
# Every time the hub stores and later compares (due times, leases, blocked_since, expires_at, rate buckets,
# slots, breakers, confirmations, history) is `store_now(url)`: on PostgreSQL the database server's clock, the
# one clock every host shares (issue 33); on SQLite (embedded: one host) this host's. The database's clock
# is read without a round trip of its own: each process reads it now and then at the start of a
# transaction it opens anyway (`transaction`), and counts on from that reading with this host's boot clock,
# which a wall clock set wrong, stepped or skewed does not move. A reading is good to the statement's round
# trip (milliseconds); the boot clock drifts from the server's by parts per million between two readings.
CLOCK_READ_EVERY = 10.0  # seconds after which a process reads the database's clock again
CLOCK_READ_SLOW = 0.5  # seconds: a reading whose round trip took longer is kept only if there is no other
_DATABASE_CLOCK = select(func.timezone("UTC", func.clock_timestamp()))
_readings: dict[str, tuple[float, datetime]] = {}  # database URL -> (boot clock, its clock) at one moment


def _boot_clock() -> float:
    """Seconds on this host's monotonic clock, counting a suspended machine's sleep where Linux can."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


def store_now(url: str) -> datetime:
    """The hub's time, naive UTC: the database server's clock on PostgreSQL, this host's on SQLite, for the
    store at `url` (the hub's: `Hub.clock`).

    No round trip but a process's first (`transaction` reads the database's clock on its way in)."""
    if url.startswith("sqlite"):
        return utcnow()
    reading = _readings.get(url)
    if reading is None:
        with transaction(url):  # outside a transaction: inside one, its start read the clock
            pass
        reading = _readings[url]
    at, clock = reading
    return clock + timedelta(seconds=_boot_clock() - at)


def _read_database_clock(conn: Connection, url: str) -> None:
    """Read the database server's clock, as of this host's boot clock, on the transaction's way in."""
    before = _boot_clock()
    clock = conn.execute(_DATABASE_CLOCK).scalar_one()
    after = _boot_clock()
    if after - before <= CLOCK_READ_SLOW or url not in _readings:
        _readings[url] = ((before + after) / 2, clock)


def _clock_stale(url: str) -> bool:
    reading = _readings.get(url)
    return reading is None or _boot_clock() - reading[0] > CLOCK_READ_EVERY


# --- proofs that the store answered (openhub.store.proof) ----------------------------------------------------
_proved: dict[str, float] = {}  # database URL -> monotonic time a statement this process sent was last answered
_SENT = "openhub_sent"  # a connection's info: when its statement in flight was sent


def record_proofs(engine: Engine, url: str) -> None:
    """Each statement `engine` sends that the store answers proves the store reachable as of its sending."""

    @event.listens_for(engine, "before_cursor_execute")
    def _sent(conn, *_args):  # type: ignore[no-untyped-def]
        conn.info[_SENT] = time.monotonic()

    @event.listens_for(engine, "after_cursor_execute")
    def _answered(conn, *_args):  # type: ignore[no-untyped-def]
        prove_at(url, conn.info.get(_SENT, float("-inf")))


def prove_at(url: str, sent: float) -> None:
    """The store at `url` answered a statement this process sent at monotonic time `sent`."""
    if sent > _proved.get(url, float("-inf")):
        _proved[url] = sent


def proved_since(url: str) -> float:
    """The monotonic time of the latest statement this process sent to `url` that was answered (-inf: none)."""
    return _proved.get(url, float("-inf"))


def sqlite_engine(url: str, **options: Any) -> Engine:
    """A new engine for the SQLite database at `url` (WAL, BEGIN IMMEDIATE); `options` for create_engine."""
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False}, **options)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")  # WAL + NORMAL may lose the last commits on power loss
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def get_engine(url: str) -> Engine:
    """The engine for `url` (a hub's OPENHUB_DATABASE_URL), one per process.

    Every commit waits for its WAL flush: a commit lost in a crash after the step it guarded
    called an external system would make the repair call it again.
    """
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is None:
        if url.startswith("sqlite"):
            engine = sqlite_engine(url)
        else:
            # No pre-ping round trip per checkout: a restarted server shows up as one
            # StoreUnavailable per process, after which SQLAlchemy recycles the whole pool.
            engine = create_engine(
                url, pool_size=PG_POOL_SIZE, max_overflow=PG_MAX_OVERFLOW, pool_timeout=PG_POOL_TIMEOUT
            )
            record_proofs(engine, url)
        _engines[key] = engine
    return engine


def dispose_engines() -> None:
    """Close every pooled connection of this process (tests, shutdown)."""
    for (pid, _url), engine in list(_engines.items()):
        if pid == os.getpid():
            engine.dispose()
    _engines.clear()


def is_postgres(conn: Connection) -> bool:
    """Whether `conn` talks to PostgreSQL (row locks with SKIP LOCKED are available)."""
    return conn.dialect.name == "postgresql"


def database_now() -> Any:
    """PostgreSQL's clock (its transaction's start) as naive UTC, an SQL expression.

    The one clock every host shares: a time that other hosts compare with their own (a lease, the
    order of messages) is taken from it, not from the clock of the host that writes it (issue 22).
    """
    return func.timezone("UTC", func.now())


def store_clock(conn: Connection, fallback: datetime) -> Any:
    """`database_now()` on PostgreSQL; on SQLite (one host, one clock) `fallback`, the caller's time."""
    return database_now() if is_postgres(conn) else fallback


def insert_or_ignore(table: Table, pg: bool, **conflict: Any) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING for PostgreSQL (`pg`) or SQLite; `conflict` names the unique
    index (index_elements, index_where). Hot-path callers build theirs once per dialect."""
    statement: Insert = (postgresql if pg else sqlite).insert(table).on_conflict_do_nothing(**conflict)
    return statement


@contextmanager
def transaction(url: str, *, first: bool = False, read_only: bool = False) -> Iterator[Connection]:
    """One database transaction on the store at `url` (the caller's hub's: `Hub.transaction`); a lost or refused
    connection, a deadlock, or no free connection in the pool in time becomes StoreUnavailable (the transaction had
    no effect and may be tried again). Under gevent, `first` goes ahead of the greenlets waiting at the store's gate
    (a heartbeat). `read_only`: rolled back at its end, never committed (`reading`)."""
    try:
        # Prefork and threads pass straight on: the gate is for greenlets only.
        gate = (
            store_gate(url, SQLITE_GATE if url.startswith("sqlite") else PG_POOL_SIZE + PG_MAX_OVERFLOW, first)
            if green()
            else nullcontext()
        )
        with gate, get_engine(url).connect() as conn, conn.begin() as tx:
            if not url.startswith("sqlite") and _clock_stale(url):
                _read_database_clock(conn, url)
            yield conn
            if read_only:
                tx.rollback()
    except DBAPIError as exc:
        if is_outage(exc):
            raise StoreUnavailable(f"message store unavailable: {exc.orig}") from exc
        raise
    except PoolTimeout as exc:  # every connection of the pool busy (more threads than connections)
        raise StoreUnavailable(f"message store: no free connection in this process's pool: {exc}") from exc


@contextmanager
def single_statement(url: str) -> Iterator[Connection]:
    """ONE statement that is its own transaction, on the store at `url`: the caller executes exactly one
    statement on the connection (data-modifying CTEs and all), which commits or has no effect, as
    `transaction` with StoreUnavailable where the store cannot be reached. On PostgreSQL the connection
    runs it in autocommit: no BEGIN and no COMMIT round trip of their own around it (psycopg sends BEGIN
    apart from the first statement), one round trip instead of three; a single statement is atomic there
    all the same. On SQLite, whose calls are no round trips, it is `transaction` (BEGIN IMMEDIATE).

    Several statements that belong together take `transaction`, never this: each statement here commits
    apart (issue 42, chain mode's hot path: bench/RESULTS.md "Chain mode round trips")."""
    if url.startswith("sqlite"):
        with transaction(url) as conn:
            yield conn
        return
    try:
        gate = store_gate(url, PG_POOL_SIZE + PG_MAX_OVERFLOW, False) if green() else nullcontext()
        with gate, get_engine(url).connect() as conn:
            # Set on this checkout only: the pool sets the connection back to READ COMMITTED on its return
            # (psycopg's autocommit attribute: no round trip either way).
            conn.execution_options(isolation_level="AUTOCOMMIT")
            if _clock_stale(url):
                _read_database_clock(conn, url)
            yield conn
    except DBAPIError as exc:
        if is_outage(exc):
            raise StoreUnavailable(f"message store unavailable: {exc.orig}") from exc
        raise
    except PoolTimeout as exc:
        raise StoreUnavailable(f"message store: no free connection in this process's pool: {exc}") from exc


def reading(url: str) -> AbstractContextManager[Connection]:
    """A transaction that only reads what is committed now: rolled back, never committed (no commit of
    its own, no WAL flush), with `transaction`'s StoreUnavailable where the store cannot be reached."""
    return transaction(url, read_only=True)


def is_outage(exc: BaseException) -> bool:
    """Whether a database error lost the whole transaction (a lost or refused connection, a deadlock):
    `transaction` raises StoreUnavailable for it; a savepoint cannot contain it."""
    if isinstance(exc, OperationalError) and _is_connectivity(exc):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def _is_connectivity(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    # Conflicts that roll the whole transaction back: trying it again is the remedy.
    if any(word in text for word in ("database is locked", "deadlock detected", "could not serialize")):
        return True
    return exc.connection_invalidated or any(
        word in text
        for word in (
            "connection",
            "could not connect",
            "server closed",
            "terminating",
            "timeout",
            "unable to open database",
            "shutting down",
            "starting up",
        )
    )
