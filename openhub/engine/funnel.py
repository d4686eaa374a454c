"""Funnels: one message per funnel value at a time, optionally in msg_timestamp order.

The check runs when a chain claims its message. On PostgreSQL a transaction-scoped advisory
lock on the funnel value serialises claims of one funnel across workers; SQLite's write lock
(BEGIN IMMEDIATE) already serialises them. A message finishing releases its funnel by
dispatching the next postponed message at once instead of waiting for the poller.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Row, and_, or_, select, text, update

from openhub.core.model import Route
from openhub.core.states import State
from openhub.engine.hub import Hub
from openhub.store.db import is_postgres
from openhub.store.schema import messages

M = messages.c
ACTIVE = (State.PROCESSING.value, State.WAITING.value, State.WAITING_FOR_RES.value)


def funnel_blocked(conn: Connection, row: Row, route: Route) -> str | None:
    """Why the message may not start now (None: it may), checked under the funnel's lock."""
    if row.funnel is None:
        return None
    if is_postgres(conn):
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:f))"), {"f": row.funnel})
    # A waiting split parent holds its funnel, but not against its own descendants.
    mine = [row.id, *_ancestors(conn, row)]
    # A cancelled message whose last step is still calling out holds its funnel until that call ends.
    holding = or_(M.state.in_(ACTIVE), M.step_run.is_not(None))
    busy = conn.execute(select(M.id).where(and_(M.funnel == row.funnel, holding, M.id.not_in(mine))).limit(1)).scalar()
    if busy is not None:
        return f"funnel {row.funnel!r} busy with message {busy}"
    if route.guaranteed_order:
        blocking = [s.value for s in State if s not in (State.OK, State.CANCEL, State.SKIPPED)]
        if route.exclude_failed:
            blocking.remove(State.FAILED.value)
        earlier = conn.execute(
            select(M.id)
            .where(
                and_(
                    M.funnel == row.funnel,
                    M.state.in_(blocking),
                    M.id.not_in(mine),
                    or_(M.msg_timestamp < row.msg_timestamp, and_(M.msg_timestamp == row.msg_timestamp, M.id < row.id)),
                )
            )
            .limit(1)
        ).scalar()
        if earlier is not None:
            return f"guaranteed order: earlier message {earlier} of funnel {row.funnel!r} is not done"
    return None


def _ancestors(conn: Connection, row: Row) -> list[int]:
    found: list[int] = []
    parent_id = row.parent_id
    while parent_id is not None and parent_id not in found:
        found.append(parent_id)
        parent_id = conn.execute(select(M.parent_id).where(M.id == parent_id)).scalar()
    return found


def release_funnel(hub: Hub, message_id: int, now: datetime) -> int | None:
    """Make the next postponed message of the finished message's funnel due now; its id (to re-drive)."""
    with hub.transaction() as conn:
        funnel = conn.execute(select(M.funnel).where(M.id == message_id)).scalar()
        if funnel is None:
            return None
        nxt = conn.execute(
            select(M.id)
            .where(and_(M.funnel == funnel, M.state == State.POSTPONED.value))
            .order_by(M.msg_timestamp, M.id)
            .limit(1)
        ).scalar()
        if nxt is None:
            return None
        # Only if it is still postponed: the poller may have re-driven it meanwhile.
        conn.execute(update(messages).where(and_(M.id == nxt, M.state == State.POSTPONED.value)).values(due_at=now))
    return nxt
