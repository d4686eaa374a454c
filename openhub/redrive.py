"""After commit: carrying out what committed writes asked for, and re-driving due messages.

Every writer of message state (openhub.lifecycle) returns its follow-ups as data; `carry_out`
is the one place that does them once the transaction committed: send the queued confirmations,
publish the children of a split and the chains of re-dispatched messages, let a funnel's next
message go, re-drive the messages made due now. Each has a backstop in the store if this process
dies first: the poller finds the confirmation, the due message and the NEW child on its own.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Callable

from sqlalchemy import Select, and_, not_, select

from . import leases
from .confirm import send_confirmations
from .db import is_postgres, transaction
from .errors import UnknownRouteError
from .funnel import release_funnel
from .hub import current
from .lifecycle import FollowUps, Tx, apply_event, redispatch, run_lost
from .policy import UNKNOWN_ROUTE_BACKOFF
from .registry import get_registry
from .schema import messages
from .split import dispatch_children
from .states import Event, State
from .store import DRAIN, paused_routes, update_message
from .workers import liveness

log = logging.getLogger("openhub.redrive")
M = messages.c
BATCH = 500
POLLED = tuple(s.value for s in (State.NEW, State.IN_QUEUE, State.PROCESSING, State.PARTLY_FAILED,
                                 State.POSTPONED, State.WAITING_FOR_RES))


def carry_out(follow: FollowUps, now: datetime) -> None:
    """Do what committed writes asked for (at time `now`, the time they were written at).

    A follow-up that fails is logged and left to the poller's backstop; the others still run.
    """
    publisher = current().publisher
    if follow.chains:
        publisher.publish_many(follow.chains)  # a refused publish is re-driven by the poller
    for message_id in follow.confirm:  # sent by their own task: a slow receiver must not hold this one
        try:
            published = publisher.publish_confirmation(message_id)
        except Exception:  # noqa: BLE001 - the row is due: the poller sends it
            log.exception("message %s: could not publish its confirmation; the poller sends it", message_id)
            continue
        if not published:  # LocalHub: no Celery, sent here
            _attempt(message_id, "send its confirmation", send_confirmations, message_id)
    for message_id in follow.children:
        _attempt(message_id, "publish its children", dispatch_children, message_id)
    due = list(follow.redrive)
    for message_id in follow.funnels:
        nxt = _attempt(message_id, "release its funnel", release_funnel, message_id, now)
        if nxt is not None:
            due.append(nxt)
    if due:
        _attempt(due[0], "re-drive", redrive_due_messages, now, due)


def _attempt(message_id: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - the poller's backstop takes over
        log.exception("message %s: could not %s after commit; the poller takes over", message_id, what)
        return None


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
    return query.order_by(M.due_at).limit(BATCH)


def _in_broker(row: Any) -> bool:
    """Whether the message's chain was handed to the broker and not yet taken from it (`leases.in_broker`)."""
    return row.state in (State.NEW, State.IN_QUEUE) or (row.state == State.PROCESSING and row.step_run is None)


def _waiting_in_broker(now: datetime, only_ids: list[int] | None) -> set[tuple[int, str]]:
    """The (message id, fencing token) of the chains whose task waits in the queues of the routes that have
    a chain in the broker due by `now`; empty where the broker cannot tell (those chains are published
    again, as a lost one is). Asked before the due rows are locked: a broker slow to answer holds none."""
    due = select(M.service, M.operation).where(M.due_at <= now, leases.in_broker())
    if only_ids is not None:
        due = due.where(M.id.in_(only_ids))
    names = due.order_by(M.due_at).limit(BATCH).subquery()  # no more than the re-drive takes
    with transaction() as conn:
        routes = [get_registry().find_route_of(row) for row in conn.execute(select(names).distinct())]
    queues = {route.step_queue(item) for route in routes if route is not None for item in route.steps}
    if not queues:
        return set()
    try:
        return current().publisher.waiting_chains(queues) or set()
    except Exception as exc:  # noqa: BLE001 - the broker is away: a chain not seen in it is published again
        log.warning("could not look for waiting chains in the broker: %s", exc)
        return set()


def redrive_due_messages(now: datetime, only_ids: list[int] | None = None) -> tuple[int, int]:
    """Publish new chains for due messages and fail over those whose lease expired.

    Returns (re-driven, repaired): PARTLY_FAILED/POSTPONED/unpublished NEW messages get a new
    chain, and so do IN_QUEUE messages and chains between steps that no task took in time (no
    failure counted), unless the broker shows their task still waiting in its queue (a backlog: their
    time is extended); a step whose lease ran out is extended while its worker lives and is re-driven
    otherwise (a run lost, no failure counted); WAITING_FOR_RES messages past their timeout count a failure.
    """
    follow = FollowUps()
    redriven = repaired = 0
    registry = get_registry()
    waiting = _waiting_in_broker(now, only_ids)
    with transaction() as conn:
        query = _due_query(now, paused_routes(conn), only_ids)
        if is_postgres(conn):
            query = query.with_for_update(skip_locked=True, key_share=True)
        rows = conn.execute(query).all()
        live = liveness(conn) if any(r.step_run is not None for r in rows) else None
        for row in rows:
            try:
                route = registry.route_of(row)
            except UnknownRouteError:
                log.error("message %s belongs to route %s.%s, which is not loaded; skipped for an hour",
                          row.id, row.service, row.operation)
                update_message(conn, row.id, due_at=now + UNKNOWN_ROUTE_BACKOFF)
                continue
            if row.state not in POLLED:  # nothing to do for it at any time
                update_message(conn, row.id, due_at=None)
                continue
            if _in_broker(row) and (row.id, row.attempt_id) in waiting:  # behind a backlog, not lost
                leases.extend(conn, row.id, now)
                continue
            if row.state in (State.NEW, State.PARTLY_FAILED, State.POSTPONED):
                redispatch(conn, row, Event.REDRIVEN, now, follow)
                redriven += 1
                continue
            stepping = row.state == State.PROCESSING and row.step_run is not None
            if stepping and live is not None and live.run_in_flight(row.worker, row.step_run, row.updated_at):
                # slow, not lost: its worker's heartbeat still lists the run
                leases.extend(conn, row.id, now)
                continue
            if row.state in (State.IN_QUEUE, State.PROCESSING) and not stepping:
                redispatch(conn, row, Event.CHAIN_LOST, now, follow)
                redriven += 1
                continue
            if row.state == State.WAITING_FOR_RES:  # the request is sent again on the next attempt
                reason = "no response before the timeout"
                leases.waiting_calls_failed(conn, row.id, reason, now)
                apply_event(Tx(conn, now, follow), row, Event.TRANSIENT, route, detail=reason, failed_error=reason,
                            error_code="RESPONSE_TIMEOUT")
            else:
                run_lost(Tx(conn, now, follow), row, route, f"lease expired in step run {row.step_run}: "
                                                            "its worker is gone")
            repaired += 1
    carry_out(follow, now)
    return redriven, repaired
