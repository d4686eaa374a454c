"""The poller: one `tick(now)` re-drives what is due and repairs what nobody carries.

Beat runs it every OPENHUB_POLL_INTERVAL as the `openhub.poll` task. Rows are claimed with
FOR UPDATE SKIP LOCKED on PostgreSQL and under SQLite's write lock, and every claimed row is
moved (new state, new due time, new fencing token) in the same transaction, so two pollers
never dispatch one message twice. The query reads only the partial index of non-final rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, not_, select, update

from .confirm import send_confirmations
from .db import is_postgres, transaction, utcnow
from .engine import Effects, after_commit, apply_event, publish_all, redispatch
from .errors import UnknownRouteError
from .registry import get_registry
from .schema import ext_calls, messages
from .states import Event, State
from .store import paused_routes

log = logging.getLogger("openhub.poller")
M = messages.c
BATCH = 500
POLLED = tuple(s.value for s in (State.NEW, State.IN_QUEUE, State.PROCESSING, State.PARTLY_FAILED,
                                 State.POSTPONED, State.WAITING_FOR_RES))
UNKNOWN_ROUTE_BACKOFF = timedelta(hours=1)


@dataclass(frozen=True)
class TickReport:
    """What one tick did."""

    redriven: int
    repaired: int
    confirmations: int
    expired: int
    seconds: float


def tick(now: datetime | None = None) -> TickReport:
    """One round of the poller at time `now` (naive UTC; default: the current time)."""
    started = time.perf_counter()
    now = now or utcnow()
    redriven, repaired = redrive_due_messages(now)
    expired = expire_guaranteed_order(now)
    confirmed = send_confirmations(now=now)
    return TickReport(redriven, repaired, confirmed, expired, time.perf_counter() - started)


def _due_query(now: datetime, paused: set[str], only_ids: list[int] | None):  # noqa: ANN202
    # `due_at <= now` implies the partial index's `due_at IS NOT NULL`: only live rows are read.
    # (No state filter here: SQLite would rather use the state index for it.)
    query = select(messages).where(M.due_at <= now)
    for name in paused:
        service, operation = name.split(".", 1)
        query = query.where(not_(and_(M.service == service, M.operation == operation,
                                      M.state.in_((State.NEW.value, State.PARTLY_FAILED.value,
                                                   State.POSTPONED.value)))))
    if only_ids is not None:
        query = query.where(M.id.in_(only_ids))
    return query.order_by(M.due_at).limit(BATCH)


def redrive_due_messages(now: datetime, only_ids: list[int] | None = None) -> tuple[int, int]:
    """Publish new chains for due messages and fail over those whose lease expired.

    Returns (re-driven, repaired): PARTLY_FAILED/POSTPONED/unpublished NEW messages get a new
    chain; IN_QUEUE/PROCESSING messages nobody carried in time and WAITING_FOR_RES messages past
    their timeout count a failure.
    """
    chains = []
    finished = []
    repaired = 0
    registry = get_registry()
    with transaction() as conn:
        query = _due_query(now, paused_routes(conn), only_ids)
        if is_postgres(conn):
            query = query.with_for_update(skip_locked=True, key_share=True)
        for row in conn.execute(query).all():
            try:
                route = registry.route(f"{row.service}.{row.operation}")
            except UnknownRouteError:
                log.error("message %s belongs to route %s.%s, which is not loaded; skipped for an hour",
                          row.id, row.service, row.operation)
                conn.execute(messages.update().where(M.id == row.id).values(due_at=now + UNKNOWN_ROUTE_BACKOFF))
                continue
            if row.state not in POLLED:  # nothing to do for it at any time
                conn.execute(messages.update().where(M.id == row.id).values(due_at=None))
                continue
            if row.state in (State.NEW, State.PARTLY_FAILED, State.POSTPONED):
                route, token, start = redispatch(conn, row, Event.REDRIVEN, now)
                chains.append((route, row.id, token, start))
                continue
            actions = Effects()
            event = Event.TRANSIENT if row.state == State.WAITING_FOR_RES else Event.LEASE_EXPIRED
            reason = ("no response before the timeout" if event is Event.TRANSIENT
                      else f"lease expired in {row.state}: the worker died or the chain was lost")
            if event is Event.TRANSIENT:  # the request is sent again on the next attempt
                conn.execute(update(ext_calls).where(and_(ext_calls.c.message_id == row.id,
                                                          ext_calls.c.state == "WAITING"))
                             .values(state="FAILED", last_error=reason, updated_at=now))
            apply_event(conn, row, event, route, None, now, actions, detail=reason, step_run=None,
                        failed_error=reason)
            finished.append((route, row.id, actions))
            repaired += 1
    publish_all(chains)
    for route, message_id, actions in finished:
        after_commit(route, message_id, actions)
    return len(chains), repaired


def expire_guaranteed_order(now: datetime) -> int:
    """FAIL guaranteed-order messages blocked in their funnel longer than the route's order_timeout."""
    routes = [r for r in get_registry().routes.values() if r.guaranteed_order and r.order_timeout]
    expired = []
    with transaction() as conn:
        for route in routes:
            query = select(messages).where(and_(
                M.service == route.service, M.operation == route.operation, M.funnel.is_not(None),
                M.state.in_((State.POSTPONED.value,)), M.received_at < now - route.order_timeout))
            if is_postgres(conn):
                query = query.with_for_update(skip_locked=True, key_share=True)
            for row in conn.execute(query.limit(BATCH)).all():
                actions = Effects()
                apply_event(conn, row, Event.ORDER_EXPIRED, route, None, now, actions,
                            failed_error=f"blocked in funnel {row.funnel!r} longer than {route.order_timeout}")
                expired.append((route, row.id, actions))
    for route, message_id, actions in expired:
        after_commit(route, message_id, actions)
    return len(expired)
