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
    # published once the rows are seen committed (at once, in all but a failed commit), by a thread, so
    # that the caller's commit does not wait for the broker.
    # (Not `conn.info`: that is the pooled DBAPI connection's, shared by every Connection checked out on it.)
    if conn not in _connections:  # listened to once per Connection, for every transaction it runs
        _connections[conn] = {PENDING: []}

        def committing(done: Connection) -> None:
            for seen, fn, at in _taken(_connections[done]):
                threading.Thread(
                    target=_publish_when_visible, args=(seen, fn, at), daemon=True, name="openhub-publish-after-commit"
                ).start()

        event.listen(conn, "commit", committing)
        event.listen(conn, "rollback", lambda done: _taken(_connections[done]))
    _connections[conn][PENDING].append((ids, publish, url))


def _taken(info: dict[Any, Any]) -> list[Any]:
    pending = list(info.get(PENDING, ()))
    info[PENDING] = []
    return pending


def _publish_when_visible(ids: list[int], publish: Callable[[], Any], url: str) -> None:
    deadline = time.monotonic() + VISIBLE_WITHIN
    pause = 0.002
    while time.monotonic() < deadline:
        try:
            with transaction(url) as conn:
                seen = conn.execute(select(messages.c.id).where(messages.c.id.in_(ids)).limit(1)).first()
        except Exception:
            log.exception("could not look for messages %s after their commit; the poller publishes them", ids)
            return
        if seen is not None:
            _publish_safely(publish)
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
    log.info(
        "messages %s were not seen committed within %g s (rolled back?); the poller publishes them if they were",
        ids,
        VISIBLE_WITHIN,
    )


def _publish_safely(publish: Callable[[], Any]) -> None:
    try:
        publish()
    except Exception:
        log.exception("could not publish messages after their commit; the poller publishes them")
