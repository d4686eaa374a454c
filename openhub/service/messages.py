"""Accepting messages from source systems (openhub/api/README.md: HTTP, Python, command line): each checked
and stored NEW all-or-nothing, in the hub's transaction or the caller's, its chain published after commit
(openhub.engine.intake). Reading them back is openhub.service.reads."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, and_, select
from sqlalchemy.exc import DataError

from openhub.core import tracing
from openhub.core.context import MessageView
from openhub.core.errors import InputError
from openhub.engine import fanout
from openhub.engine.backlog import check_backlogs
from openhub.engine.hub import Hub, given
from openhub.engine.intake import insert_unless_draining, prepare, publish_new
from openhub.store.callers import after_commit, joined, release
from openhub.store.db import is_postgres
from openhub.store.queries import M, message_view, view_of


def existing_id(conn: Connection, source_system: str, correlation_id: str) -> int:
    """Id of the message stored under (source system, correlation id)."""
    found: int = conn.execute(
        select(M.id).where(
            and_(M.source_system == source_system, M.correlation_id == correlation_id, M.parent_id.is_(None))
        )
    ).scalar_one()
    return found


def submit(
    route: str,
    payload: Any,
    *,
    source_system: str,
    correlation_id: str,
    process_id: str | None = None,
    msg_timestamp: datetime | str | None = None,
    expires_at: datetime | str | None = None,
    traceparent: str | None = None,
    connection: Any = None,
    priority: int | None = None,
    hub: Hub | None = None,
) -> MessageView:
    """Accept one message: persisted NEW in one transaction, its chain published after commit.

    `connection` (a SQLAlchemy Connection or Session, or a psycopg connection, on the hub's database):
    the message is written in the caller's transaction instead of one of its own, and exists if and only
    if the caller commits it (openhub.store.callers); its chain is published after that commit.

    The same (source system, correlation id) again returns the stored message with
    `duplicate=True` and stores nothing. A message not started by `expires_at` (or its route's
    `expires_after`) ends FAILED with error code EXPIRED, confirmed to its source system.
    With tracing on (openhub.core.tracing) the message joins the trace of `traceparent` (W3C), else the
    current span's, else a new one. `priority` 0-9, higher = sooner (None: the route's, else
    OPENHUB_DEFAULT_PRIORITY): taken by workers and by the poller before the messages below it.
    `hub`: the hub that takes it (default: the process's, `openhub.engine.hub.current`).
    """
    return submit_many(
        [
            dict(
                route=route,
                payload=payload,
                source_system=source_system,
                correlation_id=correlation_id,
                process_id=process_id,
                msg_timestamp=msg_timestamp,
                expires_at=expires_at,
                traceparent=traceparent,
                priority=priority,
            )
        ],
        connection=connection,
        hub=hub,
    )[0]


_SUBMIT_KEYS = {
    "route",
    "payload",
    "source_system",
    "correlation_id",
    "process_id",
    "msg_timestamp",
    "expires_at",
    "traceparent",
    "priority",
}


def submit_many(items: list[dict[str, Any]], *, connection: Any = None, hub: Hub | None = None) -> list[MessageView]:
    """Accept several messages all-or-nothing: one bad item stores none of them. `connection`, `hub`: as
    `submit`'s."""
    if not isinstance(items, (list, tuple)) or not items:
        raise InputError("submit_many needs a non-empty list of messages")
    hub = given(hub)
    if connection is None:
        # An admin's live settings (openhub.core.live), read at most every half poll interval. Not in the
        # caller's transaction: on SQLite it holds the one writer's lock that any transaction of ours waits for.
        hub.refresh()
    now = hub.clock()
    rows = []
    for i, item in enumerate(items):
        try:
            rows.append(prepare_item(item, now, hub=hub))
        except InputError as exc:
            raise type(exc)(f"message #{i + 1}: {exc}" if len(items) > 1 else str(exc)) from None
    return store_new(rows, connection, hub=hub)


def prepare_item(item: Any, now: datetime, *, hub: Hub | None = None) -> dict[str, Any]:
    """Check one of `submit_many`'s items and turn it into a NEW row (`prepare`); InputError says why not."""
    if not isinstance(item, dict):
        raise InputError("expected a dict")
    unknown = set(item) - _SUBMIT_KEYS
    if unknown:
        raise InputError(f"unknown field(s) {', '.join(sorted(unknown))}")
    if "route" not in item:
        raise InputError("route is required")
    return prepare(
        item["route"],
        item.get("payload"),
        source_system=item.get("source_system"),
        correlation_id=item.get("correlation_id"),
        process_id=item.get("process_id"),
        msg_timestamp=item.get("msg_timestamp"),
        expires_at=item.get("expires_at"),
        now=now,
        traceparent=item.get("traceparent"),
        priority=item.get("priority"),
        hub=hub,
    )


def store_new(rows: list[dict[str, Any]], connection: Any = None, *, hub: Hub | None = None) -> list[MessageView]:
    """Store prepared NEW rows all-or-nothing and publish their chains; a view per row, in order (an
    already stored (source system, correlation id) answers with the stored message, marked duplicate).
    `connection`: the caller's, whose transaction the rows join (`submit`); `hub`: as `submit`'s."""
    hub = given(hub)
    # One transaction: the new rows, and what the duplicates answer with. The chains are published after
    # it commits; nothing after the commit touches the store, so nothing can fail the stored messages.
    with tracing.submitting(rows) as stored_as:  # each row's traceparent: its submit span's
        try:
            if connection is None:
                with hub.transaction() as conn:
                    ids, stored, receivers = _store(hub, conn, rows)
            else:
                ids, stored, receivers = _store_in_callers_transaction(hub, connection, rows)
        except DataError as exc:  # a value the checks above let through and the database refuses: the caller's
            raise InputError(
                f"the message store refused a value of the message: {str(exc.orig).splitlines()[0]}"
            ) from None
        stored_as(ids)
        # A topic's message has no chain of its own (it ended OK, fanned out): its receivers have theirs.
        fresh = [(i, row) for i, row in zip(ids, rows) if i is not None and row["state"] == "NEW"] + receivers
        if connection is None:
            publish_new(hub, fresh)
        elif fresh:
            after_commit(connection, [i for i, _ in fresh], lambda: publish_new(hub, fresh), hub.settings.database_url)
    views: list[MessageView] = []
    for n, (row, message_id) in enumerate(zip(rows, ids)):
        if message_id is None:
            views.append(stored[n])
        else:  # what was just written; no need to read it back
            views.append(
                view_of(
                    SimpleNamespace(
                        **{
                            **row,
                            "id": message_id,
                            "custom_data": None,
                            "business_errors": None,
                            "failed_step": None,
                            "failed_error": None,
                            "finished_at": row.get("finished_at"),
                        }
                    )
                )
            )
    return views


Stored = tuple[list[int | None], dict[int, MessageView], list[tuple[int, dict[str, Any]]]]


def _store(hub: Hub, conn: Connection, rows: list[dict[str, Any]]) -> Stored:
    """Insert the rows (Draining while the hub drains, Backlogged past a backlog's cap) and a topic's receivers
    (openhub.engine.fanout); their ids, the stored views of the duplicates, and the new receivers."""
    families = fanout.prepare_receivers(rows, hub)  # before anything is written: a refusal stores nothing
    check_backlogs(conn, rows, hub.settings, hub.registry, [r for f in families for r in f.receivers])
    ids = insert_unless_draining(conn, rows)
    receivers = fanout.write_receivers(conn, rows, ids, families, hub) if families else []
    duplicates = {
        n: message_view(conn, existing_id(conn, row["source_system"], row["correlation_id"]), duplicate=True)
        for n, (row, i) in enumerate(zip(rows, ids))
        if i is None
    }
    return ids, duplicates, receivers


def _store_in_callers_transaction(hub: Hub, connection: Any, rows: list[dict[str, Any]]) -> Stored:
    """`_store` in the caller's transaction, in a savepoint of it on PostgreSQL (a refused insert leaves the
    caller's transaction as it was). The rows are due at once: nothing may tell the hub of the caller's
    commit (psycopg), or the process may die before publishing; the poller publishes them then."""
    for row in rows:
        row["due_at"] = row["received_at"]
    conn = joined(connection, hub.settings.database_url)
    try:
        if not is_postgres(conn):
            return _store(hub, conn, rows)
        with conn.begin_nested():
            return _store(hub, conn, rows)
    finally:
        release(connection, conn)
