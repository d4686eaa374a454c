"""The caller's own transaction, joined by a submit (`openhub.submit(..., connection=...)`).

A service that writes its order and submits its message in one transaction on the hub's database
gets both or neither: the message rows are written through the caller's connection and commit or roll
back with the caller's rows. What the hub does after its own commit (publish the message's chain) is
done after the caller's: at once where the connection tells its commit (a SQLAlchemy Session, or a
Connection), by the poller within a poll interval where it cannot (a plain psycopg connection), and by
the poller too where the process dies between the commit and the publish: the message is stored NEW
and due at once, and the poller publishes every due NEW message whose chain is not in the broker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from openhub.core.errors import InputError
from openhub.store.db import transaction
from openhub.store.schema import messages

log = logging.getLogger("openhub.callers")
VISIBLE_WITHIN = 5.0  # seconds a committed write is looked for before the poller is left to publish it

# One engine per plain psycopg connection, whose one pooled connection is the caller's (never closed,
# committed or rolled back by the hub): built on first use, forgotten with the connection.
_psycopg_engines: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()


def joined(connection: Any, url: str) -> Connection:
    """The caller's `connection` as a SQLAlchemy Connection in the caller's transaction: a Connection
    itself, a Session's, or one wrapping a plain psycopg connection. InputError: none of these, a
    connection in autocommit mode (no transaction to join), or one on another database than the hub's
    (at `url`)."""
    if isinstance(connection, Session):
        conn = connection.connection()
    elif isinstance(connection, Connection):
        conn = connection
    elif type(connection).__module__.startswith("psycopg"):
        if getattr(connection, "autocommit", False):
            raise InputError("connection is in autocommit mode: there is no transaction for the message to join")
        conn = _psycopg_engine(connection).connect()
    else:
        raise InputError(
            f"connection must be a SQLAlchemy Connection or Session or a psycopg connection, "
            f"got {type(connection).__name__}"
        )
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        raise InputError("connection is in autocommit mode: there is no transaction for the message to join")
    _check_same_database(conn, url)
    return conn


def release(connection: Any, conn: Connection) -> None:
    """Give back what `joined` made of `connection` (the Connection over a psycopg connection; the
    caller's own is left open, in its transaction)."""
    if not isinstance(connection, (Connection, Session)):
        conn.close()


def _psycopg_engine(raw: Any) -> Engine:
    engine = _psycopg_engines.get(raw)
    if engine is None:
        engine = create_engine(
            "postgresql+psycopg://", creator=lambda: raw, poolclass=StaticPool, pool_reset_on_return=None
        )
        # The caller's transaction is the caller's: the hub's Connection over it neither commits nor rolls
        # it back (SQLAlchemy would, on first connect and on closing a Connection it began).
        setattr(engine.dialect, "do_rollback", lambda _dbapi: None)  # noqa: B010 - mypy: no assigning to a method
        setattr(engine.dialect, "do_commit", lambda _dbapi: None)  # noqa: B010
        _psycopg_engines[raw] = engine
    return engine


def _check_same_database(conn: Connection, database_url: str) -> None:
    hub = make_url(database_url)
    url = conn.engine.url
    if url.drivername.startswith("postgresql") and hub.drivername.startswith("postgresql"):
        info = conn.connection.dbapi_connection.info  # type: ignore[union-attr]
        ours = (hub.host or "localhost", int(hub.port or 5432), hub.database)
        theirs = (info.host, int(info.port), info.dbname)
        if _host(ours[0]) == _host(theirs[0]) and ours[1:] == theirs[1:]:
            return
    elif url.get_backend_name() == hub.get_backend_name() == "sqlite":
        import os.path

        if os.path.realpath(url.database or "") == os.path.realpath(hub.database or ""):
            return
    raise InputError(
        "connection is not on the hub's database (OPENHUB_DATABASE_URL): a message can join "
        "only a transaction of the store it is written to"
    )


def _host(name: str) -> str:
    return "127.0.0.1" if name in ("localhost", "::1", "") else name


def after_commit(connection: Any, ids: list[int], publish: Callable[[], Any], url: str) -> None:
    """Call `publish` once the caller's transaction that wrote the messages `ids` (in the hub's database at
    `url`) committed, and never if it rolls back; a plain psycopg connection tells neither: its messages
    are the poller's to publish."""
    if isinstance(connection, Session):
        _on_session_commit(connection, publish)
    elif isinstance(connection, Connection):
        _on_connection_commit(connection, ids, publish, url)


PENDING = "openhub.publish_after_commit"  # in a Session's `info`: what its commit publishes
_connections: weakref.WeakKeyDictionary[Connection, dict[str, list[Any]]] = weakref.WeakKeyDictionary()


def _on_session_commit(session: Session, publish: Callable[[], Any]) -> None:
    if PENDING not in session.info:  # listened to once per session, for every transaction it runs
        session.info[PENDING] = []

        def committed(_session: Session) -> None:
            for fn in _taken(session.info):
                _publish_safely(fn)

        event.listen(session, "after_commit", committed)
        event.listen(session, "after_rollback", lambda _session: _taken(session.info))
    session.info[PENDING].append(publish)


def _on_connection_commit(conn: Connection, ids: list[int], publish: Callable[[], Any], url: str) -> None:
    # A Connection's "commit" event comes just before the database commits, never after: the chain is
    # published once the rows are seen committed (at once, in all but a failed commit), by the process's
    # publishing thread (`_AfterCommit`), so that the caller's commit does not wait for the broker.
    # (Not `conn.info`: that is the pooled DBAPI connection's, shared by every Connection checked out on it.)
    if conn not in _connections:  # listened to once per Connection, for every transaction it runs
        _connections[conn] = {PENDING: []}

        def committing(done: Connection) -> None:
            for seen, fn, at in _taken(_connections[done]):
                _after_commit.put(seen, fn, at)

        event.listen(conn, "commit", committing)
        event.listen(conn, "rollback", lambda done: _taken(_connections[done]))
    _connections[conn][PENDING].append((ids, publish, url))


def _taken(info: dict[Any, Any]) -> list[Any]:
    pending = list(info.get(PENDING, ()))
    info[PENDING] = []
    return pending


class _AfterCommit:
    """The process's one thread that publishes what committed Connections handed it, once their messages are
    seen committed: all waiting ones looked for in one statement per database, every 2 ms at first, backing
    off to 200 ms while none shows. A thread per commit, each looking for its own rows, cost the caller as
    much CPU as the submit itself and halved its rate (bench/peers.py, issue 37).

    Started on first use in each process (a forked worker's child has no thread of its parent's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self._new: list[tuple[list[int], Callable[[], Any], str, float]] = []
        self._pid: int | None = None

    def put(self, ids: list[int], publish: Callable[[], Any], url: str) -> None:
        with self._lock:
            self._new.append((ids, publish, url, time.monotonic() + VISIBLE_WITHIN))
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, daemon=True, name="openhub-publish-after-commit").start()
        self._arrived.set()

    def _run(self) -> None:
        waiting: list[tuple[list[int], Callable[[], Any], str, float]] = []
        pause = 0.002
        while True:
            if self._arrived.wait(None if not waiting else pause):
                pause = 0.002  # something new: look soon
            else:
                pause = min(pause * 2, 0.2)
            self._arrived.clear()
            with self._lock:
                waiting, self._new = waiting + self._new, []
            waiting = self._publish_seen(waiting)

    def _publish_seen(
        self, waiting: list[tuple[list[int], Callable[[], Any], str, float]]
    ) -> list[tuple[list[int], Callable[[], Any], str, float]]:
        """Publish the waiting ones whose messages are committed; the ones still to wait for."""
        left = []
        for url in dict.fromkeys(item[2] for item in waiting):
            mine = [item for item in waiting if item[2] == url]
            try:
                with transaction(url) as conn:
                    wanted = sorted({i for item in mine for i in item[0]})
                    seen = set(conn.execute(select(messages.c.id).where(messages.c.id.in_(wanted))).scalars())
            except Exception:
                log.exception("could not look for messages after their commit; the poller publishes them")
                continue
            now = time.monotonic()
            for ids, publish, at, deadline in mine:
                if seen.intersection(ids):
                    _publish_safely(publish)
                elif now < deadline:
                    left.append((ids, publish, at, deadline))
                else:
                    log.info(
                        "messages %s were not seen committed within %g s (rolled back?); the poller publishes "
                        "them if they were",
                        ids,
                        VISIBLE_WITHIN,
                    )
        return left


_after_commit = _AfterCommit()


def _publish_safely(publish: Callable[[], Any]) -> None:
    try:
        publish()
    except Exception:
        log.exception("could not publish messages after their commit; the poller publishes them")
