"""Re-driving messages whose time has come: the due scan.

`scan_due_messages` reads the non-final messages whose `due_at` has passed, in one transaction, and
gives each what its state asks for: a new chain (PARTLY_FAILED, POSTPONED, an unpublished NEW, a chain
no task took), a longer lease (a slow step whose worker lives, a chain waiting behind a backlog) or a
failure (a lost run, a response that never came). What has to happen once that committed is added to
the caller's `FollowUps`: `openhub.engine.followups.redrive_due_messages` scans and then carries those
out. The poller runs it every tick; operator actions and the follow-ups themselves (a funnel's next
message, a message made due now) run it for the messages they name.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, not_, select

from openhub.core import codes
from openhub.core.errors import UnknownRouteError
from openhub.core.policy import UNKNOWN_ROUTE_BACKOFF
from openhub.core.states import Event, State
from openhub.engine import leases
from openhub.engine.hub import Hub
from openhub.engine.lifecycle import FollowUps, Tx, apply_event, redispatch, run_lost
from openhub.store.db import is_postgres
from openhub.store.queries import DRAIN, paused_routes, update_message
from openhub.store.schema import messages
from openhub.store.workers import liveness

log = logging.getLogger("openhub.redrive")
M = messages.c
BATCH = 500  # rows one scan takes (the poller pages its lost-run repair by it too)
POLLED = tuple(
    s.value
    for s in (State.NEW, State.IN_QUEUE, State.PROCESSING, State.PARTLY_FAILED, State.POSTPONED, State.WAITING_FOR_RES)
)


def _due_query(now: datetime, paused: set[str], only_ids: list[int] | None) -> Select[Any]:
    # `due_at <= now` implies the partial index's `due_at IS NOT NULL`: only live rows are read.
    # (No state filter here: SQLite would rather use the state index for it.)
    query = select(messages).where(M.due_at <= now)
    waiting = M.state.in_((State.NEW.value, State.PARTLY_FAILED.value, State.POSTPONED.value))
    if DRAIN in paused:  # nothing new starts; the chains under way go on
        query = query.where(not_(waiting))
    for name in paused - {DRAIN}:
        service, operation = name.split(".", 1)
        query = query.where(not_(and_(M.service == service, M.operation == operation, waiting)))
    if only_ids is not None:
        query = query.where(M.id.in_(only_ids))
    return query.order_by(M.priority.desc(), M.due_at).limit(BATCH)  # higher priority first, then oldest due


def _in_broker(row: Any) -> bool:
    """Whether the message's chain was handed to the broker and not yet taken from it (`leases.in_broker`)."""
    return row.state in (State.NEW, State.IN_QUEUE) or (row.state == State.PROCESSING and row.step_run is None)


def _waiting_in_broker(hub: Hub, now: datetime, only_ids: list[int] | None) -> set[tuple[int, str]]:
    """The (message id, fencing token) of the chains whose task waits in the queues of the routes that have
    a chain in the broker due by `now`; empty where the broker cannot tell (those chains are published
    again, as a lost one is). Asked before the due rows are locked: a broker slow to answer holds none."""
    due = select(M.service, M.operation).where(M.due_at <= now, leases.in_broker())
    if only_ids is not None:
        due = due.where(M.id.in_(only_ids))
    names = due.order_by(M.priority.desc(), M.due_at).limit(BATCH).subquery()  # no more than the re-drive takes
    with hub.transaction() as conn:
        routes = [hub.registry.find_route_of(row) for row in conn.execute(select(names).distinct())]
    queues = {route.step_queue(item) for route in routes if route is not None for item in route.steps}
    if not queues:
        return set()
    try:
        return hub.publisher.waiting_chains(queues) or set()
    except Exception as exc:
        log.warning("could not look for waiting chains in the broker: %s", exc)
        return set()


def scan_due_messages(hub: Hub, now: datetime, follow: FollowUps, only_ids: list[int] | None = None) -> tuple[int, int]:
    """Move the due messages (all, or those of `only_ids`) on, in one transaction; what must happen after
    commit is added to `follow`, for `openhub.engine.followups.carry_out`.

    Returns (re-driven, repaired), as `openhub.engine.followups.redrive_due_messages` tells.
    """
    redriven = repaired = 0
    registry, settings = hub.registry, hub.settings
    waiting = _waiting_in_broker(hub, now, only_ids)
    with hub.transaction() as conn:
        tx = Tx(conn, now, follow, hub)
        query = _due_query(now, paused_routes(conn), only_ids)
        if is_postgres(conn):
            query = query.with_for_update(skip_locked=True, key_share=True)
        rows = conn.execute(query).all()
        live = liveness(conn, settings.worker_dead_after) if any(r.step_run is not None for r in rows) else None
        for row in rows:
            try:
                route = registry.route_of(row)
            except UnknownRouteError:
                log.error(
                    "message %s belongs to route %s.%s, which is not loaded; skipped for an hour",
                    row.id,
                    row.service,
                    row.operation,
                )
                update_message(conn, row.id, due_at=now + UNKNOWN_ROUTE_BACKOFF)
                continue
            if row.state not in POLLED:  # nothing to do for it at any time
                update_message(conn, row.id, due_at=None)
                continue
            if _in_broker(row) and (row.id, row.attempt_id) in waiting:  # behind a backlog, not lost
                leases.extend(conn, row.id, now, settings)
                continue
            if row.state in (State.NEW, State.PARTLY_FAILED, State.POSTPONED):
                redispatch(tx, row, Event.REDRIVEN)
                redriven += 1
                continue
            stepping = row.state == State.PROCESSING and row.step_run is not None
            if stepping and live is not None and live.run_in_flight(row.worker, row.step_run, row.updated_at):
                # slow, not lost: its worker's heartbeat still lists the run
                leases.extend(conn, row.id, now, settings)
                continue
            if row.state in (State.IN_QUEUE, State.PROCESSING) and not stepping:
                redispatch(tx, row, Event.CHAIN_LOST)
                redriven += 1
                continue
            if row.state == State.WAITING_FOR_RES:  # the request is sent again on the next attempt
                reason = "no response before the timeout"
                leases.waiting_calls_failed(conn, row.id, reason, now)
                apply_event(
                    tx,
                    row,
                    Event.TRANSIENT,
                    route,
                    detail=reason,
                    failed_error=reason,
                    error_code=codes.RESPONSE_TIMEOUT,
                )
            else:
                run_lost(tx, row, route, f"lease expired in step run {row.step_run}: its worker is gone")
            repaired += 1
    return redriven, repaired
