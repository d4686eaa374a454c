"""The audit trail: who did what to the hub, written in the transaction of its effect.

Every operator action (openhub.service.actions, the breaker, the token store) calls `record(conn, ...)` inside
the transaction that makes its change, so a rolled-back action leaves no entry and a committed one
always has its entry. Who acts is the `Actor` of the context (`acting_as`): the API sets the caller's
token name, role, client address and request id; outside a request (the CLI, Python) the actor is the
local user (`local:<user>`, role admin: whoever runs the CLI holds the store's credentials anyway).
Entries are only ever inserted: nothing in the package updates or deletes them.
"""

from __future__ import annotations

import contextlib
import getpass
import json
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator

from sqlalchemy import select
from sqlalchemy.engine import Connection

from openhub.core.context import aware
from openhub.core.redact import redact_text
from openhub.store.db import store_clock, transaction, utcnow
from openhub.store.schema import audit, audit_messages

ROLES = ("viewer", "operator", "admin")  # each may do what the ones before it may
A = audit.c


@dataclass(frozen=True)
class Actor:
    """Who acts: a token's name and role, and where the request came from."""

    name: str
    role: str
    client: str | None = None
    request_id: str | None = None


def _local() -> Actor:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return Actor(f"local:{user}", "admin")


_actor: ContextVar[Actor | None] = ContextVar("openhub_actor", default=None)


def current_actor() -> Actor:
    """The actor of this context (the local user outside an API request)."""
    return _actor.get() or _local()


@contextlib.contextmanager
def acting_as(actor: Actor) -> Iterator[Actor]:
    """Within the block, actions are recorded as `actor`'s."""
    token = _actor.set(actor)
    try:
        yield actor
    finally:
        _actor.reset(token)


def set_actor(actor: Actor) -> None:
    """Make `actor` the actor of the rest of this context (an API request's)."""
    _actor.set(actor)


def masked(value: Any) -> str | None:
    """A value as the trail shows it: JSON text with secrets redacted (`openhub.core.redact`)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return redact_text(text)


def record(
    conn: Connection,
    action: str,
    *,
    target: str | None = None,
    message_ids: Iterable[int] = (),
    old: Any = None,
    new: Any = None,
    now: datetime | None = None,
) -> int:
    """Write one audit entry of the current actor in `conn`'s transaction; its id."""
    actor = current_actor()
    ids = sorted({int(i) for i in message_ids})
    entry_id = conn.execute(
        audit.insert()
        .values(
            at=now if now is not None else store_clock(conn, utcnow()),  # `conn`'s database clock
            who=actor.name[:100],
            role=actor.role,
            action=action,
            target=masked(target),
            message_ids=json.dumps(ids) if ids else None,
            old_value=masked(old),
            new_value=masked(new),
            client=(actor.client or None) and actor.client[:100],
            request_id=(actor.request_id or None) and actor.request_id[:100],
        )
        .returning(audit.c.id)
    ).scalar_one()
    if ids:
        conn.execute(audit_messages.insert(), [{"audit_id": entry_id, "message_id": i} for i in ids])
    return int(entry_id)


def _shown(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": aware(row.at).isoformat(),
        "who": row.who,
        "role": row.role,
        "action": row.action,
        "target": row.target,
        "message_ids": json.loads(row.message_ids) if row.message_ids else [],
        "old_value": row.old_value,
        "new_value": row.new_value,
        "client": row.client,
        "request_id": row.request_id,
    }


def entries(
    *,
    url: str,
    who: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    message_id: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Audit entries matching every given filter, newest first (`since` inclusive, `until` exclusive), in the
    store whose `url` the driver gives (the API's served hub's, the CLI's process database)."""
    query = select(audit)
    if who is not None:
        query = query.where(A.who == who)
    if action is not None:
        query = query.where(A.action == action)
    if since is not None:
        query = query.where(A.at >= since)
    if until is not None:
        query = query.where(A.at < until)
    if message_id is not None:
        query = query.where(
            A.id.in_(select(audit_messages.c.audit_id).where(audit_messages.c.message_id == int(message_id)))
        )
    with transaction(url) as conn:
        return [_shown(r) for r in conn.execute(query.order_by(A.id.desc()).limit(int(limit)))]


def message_entries(conn: Connection, message_id: int) -> list[dict[str, Any]]:
    """The audit entries naming one message, oldest first (its history shows them)."""
    query = select(audit).where(
        A.id.in_(select(audit_messages.c.audit_id).where(audit_messages.c.message_id == int(message_id)))
    )
    return [_shown(r) for r in conn.execute(query.order_by(A.id))]
