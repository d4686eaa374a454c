"""The poller: one `tick(now)` re-drives what is due and repairs what nobody carries.

Beat runs it every OPENHUB_POLL_INTERVAL as the `openhub.poll` task. Rows are claimed with
FOR UPDATE SKIP LOCKED on PostgreSQL and under SQLite's write lock, and every claimed row is
moved (new state, new due time, new fencing token) in the same transaction, so two pollers
never dispatch one message twice. The query reads only the partial index of non-final rows.

A step's lease is judged by the worker holding it (openhub.workers): a dead worker's steps are
repaired at once, a live worker's lease is extended however slow its step, and a chain no step
has taken (a broker backlog, a flushed broker) is published again without counting a failure.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, not_, select, update

from .config import get_settings
from .confirm import send_confirmations
from .db import is_postgres, transaction, utcnow
from .engine import Effects, after_commit, apply_event, publish_all, redispatch
from .errors import UnknownRouteError
from .limits import release_runs
from .registry import get_registry
from .schema import ext_calls, messages
from .states import Action, CallState, Event, State
from .store import DRAIN, is_paused, paused_routes, update_message
from .workers import liveness

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
    dead_workers: frozenset[str] = frozenset()  # worker processes witnessed dead (their deliveries go back)


def tick(now: datetime | None = None) -> TickReport:
    """One round of the poller at time `now` (naive UTC; default: the current time)."""
    started = time.perf_counter()
    now = now or utcnow()
    lost, dead = repair_lost_runs(now)
    redriven, repaired = redrive_due_messages(now)
    repaired += lost
    expired = expire_guaranteed_order(now)
    confirmed = send_confirmations(now=now)
    return TickReport(redriven, repaired, confirmed, expired, time.perf_counter() - started, frozenset(dead))


def _due_query(now: datetime, paused: set[str], only_ids: list[int] | None):  # noqa: ANN202
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


def repair_lost_runs(now: datetime) -> tuple[int, set[str]]:
    """Fail over at once the step runs that ended without recording an outcome: their worker died, or
    its live process no longer lists them (the task crashed). +1 failure, re-driven now: the retry
    interval is for a failing external system, and a lost run says nothing about it.

    Only rows with a run in flight are read (a small partial index). Returns how many were repaired,
    and the worker processes witnessed dead.
    """
    finished = []
    lost = []
    with transaction() as conn:
        query = select(messages).where(M.worker.is_not(None), M.step_run.is_not(None)).limit(BATCH)
        if is_postgres(conn):
            query = query.with_for_update(skip_locked=True, key_share=True)
        rows = conn.execute(query).all()
        live = liveness(conn)  # read after the rows: a run listed now was not recorded before them
        if live.dead:
            # Between two steps the worker that ran the first is the one that publishes the second's
            # task: if it died, that task may never have been sent, or died with it unstarted. Due
            # now, the chain is published again at once (no failure) instead of after the lease grace.
            conn.execute(update(messages).where(
                M.worker.in_(live.dead), M.step_run.is_(None),
                M.state.in_((State.PROCESSING.value, State.IN_QUEUE.value))).values(worker=None, due_at=now))
        for row in rows:
            if live.run_in_flight(row.worker, row.step_run, row.updated_at) is not False:
                continue
            lost.append(row.step_run)
            route = get_registry().routes.get(f"{row.service}.{row.operation}")
            actions = Effects()
            if row.state == State.PROCESSING and route is not None:
                reason = (f"step run {row.step_run} ended without an outcome: "
                          f"worker {row.worker} died or its task crashed")
                apply_event(conn, row, Event.LEASE_EXPIRED, route, None, now, actions, detail=reason,
                            step_run=None, worker=None, due_at=now, failed_error=reason, error_code="WORKER_LOST")
            else:  # a cancelled message's last run is over: its funnel may go on
                update_message(conn, row.id, step_run=None, worker=None, updated_at=now)
                if row.funnel is not None:
                    actions.add(Action.RELEASE_FUNNEL)
            if route is not None:
                finished.append((route, row.id, actions))
        if lost and get_settings().system_limits:  # the calls in flight they held are over too
            release_runs(conn, lost)
    for route, message_id, actions in finished:
        after_commit(route, message_id, actions)
    return len(finished), live.dead


def redrive_due_messages(now: datetime, only_ids: list[int] | None = None) -> tuple[int, int]:
    """Publish new chains for due messages and fail over those whose lease expired.

    Returns (re-driven, repaired): PARTLY_FAILED/POSTPONED/unpublished NEW messages get a new
    chain, and so do IN_QUEUE messages and chains between steps that no task took in time (no
    failure counted); a step whose lease ran out is extended while its worker lives and counts a
    failure otherwise; WAITING_FOR_RES messages past their timeout count a failure.
    """
    chains = []
    finished = []
    repaired = 0
    registry = get_registry()
    with transaction() as conn:
        query = _due_query(now, paused_routes(conn), only_ids)
        if is_postgres(conn):
            query = query.with_for_update(skip_locked=True, key_share=True)
        rows = conn.execute(query).all()
        live = liveness(conn) if any(r.step_run is not None for r in rows) else None
        for row in rows:
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
            stepping = row.state == State.PROCESSING and row.step_run is not None
            if stepping and live is not None and live.run_in_flight(row.worker, row.step_run, row.updated_at):
                # slow, not lost: its worker's heartbeat still lists the run
                update_message(conn, row.id, due_at=now + get_settings().lease_grace)
                continue
            if row.state in (State.IN_QUEUE, State.PROCESSING) and not stepping:
                route, token, start = redispatch(conn, row, Event.CHAIN_LOST, now)
                chains.append((route, row.id, token, start))
                continue
            actions = Effects()
            if row.state == State.WAITING_FOR_RES:  # the request is sent again on the next attempt
                event, reason = Event.TRANSIENT, "no response before the timeout"
                conn.execute(update(ext_calls).where(and_(ext_calls.c.message_id == row.id,
                                                          ext_calls.c.state == CallState.WAITING.value))
                             .values(state=CallState.FAILED.value, last_error=reason, updated_at=now))
                apply_event(conn, row, event, route, None, now, actions, detail=reason, failed_error=reason,
                            error_code="RESPONSE_TIMEOUT")
            else:
                reason = f"lease expired in step run {row.step_run}: its worker is gone"
                apply_event(conn, row, Event.LEASE_EXPIRED, route, None, now, actions, detail=reason, due_at=now,
                            step_run=None, worker=None, failed_error=reason, error_code="WORKER_LOST")
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
        paused = paused_routes(conn)
        for route in routes:
            if is_paused(paused, route.name):  # waiting for an operator is not waiting in the funnel
                continue
            query = select(messages).where(and_(
                M.service == route.service, M.operation == route.operation, M.funnel.is_not(None),
                M.state.in_((State.POSTPONED.value,)), M.blocked_since < now - route.order_timeout))
            if is_postgres(conn):
                query = query.with_for_update(skip_locked=True, key_share=True)
            for row in conn.execute(query.limit(BATCH)).all():
                actions = Effects()
                apply_event(conn, row, Event.ORDER_EXPIRED, route, None, now, actions, error_code="ORDER_TIMEOUT",
                            failed_error=f"blocked in funnel {row.funnel!r} longer than {route.order_timeout}")
                expired.append((route, row.id, actions))
    for route, message_id, actions in expired:
        after_commit(route, message_id, actions)
    return len(expired)
