"""The poller: one `tick(hub, now)` re-drives what is due and repairs what nobody carries.

Beat runs it every OPENHUB_POLL_INTERVAL as the `openhub.poll` task. Rows are claimed with
FOR UPDATE SKIP LOCKED on PostgreSQL and under SQLite's write lock, and every claimed row is
moved (new state, new due time, new fencing token) in the same transaction, so two pollers
never dispatch one message twice. The query reads only the partial index of non-final rows.

A step's lease is judged by the worker holding it (openhub.store.workers): a dead worker's steps are
repaired at once, a live worker's lease is extended however slow its step, and a chain no step
has taken (a broker backlog, a flushed broker) is published again without counting a failure, unless
the broker shows its task still waiting. A broker that lost its queues is seen by the mark the hub
keeps in it, and the chains it had are published again at the next tick, not after the lease grace.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, or_, select

from openhub.core import codes
from openhub.core.runs import TimeLimit
from openhub.core.states import Event, State
from openhub.engine.due import BATCH
from openhub.engine.followups import carry_out, redrive_due_messages
from openhub.engine.hub import Hub
from openhub.engine.leases import chains_in_broker_due, orphan_chains_due, release_run
from openhub.engine.lifecycle import FollowUps, Tx, apply_event, run_lost
from openhub.outbound.confirm import hand_over_due, send_confirmations
from openhub.outbound.limits import release_runs
from openhub.store.db import is_postgres
from openhub.store.queries import is_paused, paused_routes
from openhub.store.schema import messages
from openhub.store.workers import liveness

log = logging.getLogger("openhub.poller")
M = messages.c
Mark = tuple[datetime, int]  # a run's lease time and message id: where a page of the lost-run repair starts


@dataclass(frozen=True)
class TickReport:
    """What one tick did."""

    redriven: int
    repaired: int
    confirmations: int
    expired: int
    seconds: float
    dead_workers: frozenset[str] = frozenset()  # worker processes witnessed dead (their deliveries go back)


def tick(hub: Hub, now: datetime | None = None, *, confirm_deadline: TimeLimit | None = None) -> TickReport:
    """One round of `hub`'s poller at time `now` (naive UTC; default: the hub's time, its `clock`);
    `confirm_deadline`: how the driver interrupts a confirmer past OPENHUB_CONFIRM_TIMEOUT (openhub.confirm)."""
    started = time.perf_counter()
    hub.refresh()  # an admin's live settings (openhub.core.live), read at most every half poll interval
    now = now or hub.clock()
    budget = hub.settings.poll_interval.total_seconds()
    lost, dead = repair_lost_runs(hub, now, budget=budget)  # as the sends below
    look_for_chains_lost_with_broker(hub, now)
    redriven, repaired = redrive_due_messages(hub, now)
    repaired += lost
    expired = expire_guaranteed_order(hub, now)
    confirmed = confirm_due(hub, now, confirm_deadline)
    return TickReport(redriven, repaired, confirmed, expired, time.perf_counter() - started, frozenset(dead))


def confirm_due(hub: Hub, now: datetime, deadline: TimeLimit | None = None) -> int:
    """Due confirmations (retries, and those whose task was lost) go to `openhub.confirm` tasks on their own
    queue (OPENHUB_CONFIRM_QUEUE), never sent on the tick's step worker; how many messages' went. Where
    there is no such task (LocalHub), the tick sends them itself, for at most one poll interval (at least
    one send): slow receivers wait for the next; `deadline` interrupts a confirmer there (openhub.confirm)."""
    handed = hand_over_due(now, hub.publisher.publish_confirmation, hub.settings)
    if handed is not None:
        return handed
    return send_confirmations(
        now=now,
        budget=hub.settings.poll_interval.total_seconds(),
        deadline=deadline,
        settings=hub.settings,
        registry=hub.registry,
    )


def repair_lost_runs(hub: Hub, now: datetime, budget: float | None = None) -> tuple[int, set[str]]:
    """Fail over at once the step runs that ended without recording an outcome: their worker died, or
    its live process no longer lists them (the task crashed). Re-driven now, no failure counted (the hub's
    fault, not the message's: `lifecycle.run_lost`): the retry interval is for a failing external system,
    and a lost run says nothing about it.

    Only rows with a run in flight are read (a small partial index), every one of them: oldest lease
    first, BATCH rows a transaction, until none is left or `budget` seconds are spent (at least one
    page; the rest are the next tick's). Returns how many were repaired, and the worker processes
    witnessed dead.
    """
    started = time.monotonic()
    repaired, dead = 0, set()
    after: Mark | None = None
    while True:
        lost, witnessed, after = _repair_page(hub, now, after)
        repaired, dead = repaired + lost, dead | witnessed
        if after is None or (budget is not None and time.monotonic() - started >= budget):
            return repaired, dead


def _repair_page(hub: Hub, now: datetime, after: Mark | None) -> tuple[int, set[str], Mark | None]:
    """One page of `repair_lost_runs`: the runs leased after `after`, oldest first. How many were repaired,
    the processes witnessed dead, and where the next page starts (None: this was the last)."""
    follow = FollowUps()
    lost = []
    with hub.transaction() as conn:
        query = select(messages).where(M.worker.is_not(None), M.step_run.is_not(None))
        if after is not None:
            query = query.where(or_(M.updated_at > after[0], and_(M.updated_at == after[0], M.id > after[1])))
        query = query.order_by(M.updated_at, M.id).limit(BATCH)
        if is_postgres(conn):
            query = query.with_for_update(skip_locked=True, key_share=True)
        rows = conn.execute(query).all()
        # Read after the rows: a run listed now was not recorded before them.
        live = liveness(conn, hub.settings.worker_dead_after)
        if live.dead:
            # Between two steps the worker that ran the first is the one that publishes the second's
            # task: if it died, that task may never have been sent, or died with it unstarted. Due
            # now, the chain is published again at once (no failure) instead of after the lease grace.
            orphan_chains_due(conn, live.dead, now)
        for row in rows:
            if live.run_in_flight(row.worker, row.step_run, row.updated_at) is not False:
                continue
            lost.append(row.step_run)
            route = hub.registry.find_route_of(row)
            if row.state == State.PROCESSING and route is not None:
                run_lost(
                    Tx(conn, now, follow, hub),
                    row,
                    route,
                    f"step run {row.step_run} ended without an outcome: worker {row.worker} died or its task crashed",
                )
            else:  # a cancelled message's last run is over: its funnel may go on
                release_run(conn, row.id, now)
                if row.funnel is not None:
                    follow.funnels.append(row.id)
        if lost and hub.settings.system_limits:  # the calls in flight they held are over too
            release_runs(conn, lost)
    carry_out(hub, follow, now)
    return len(lost), live.dead, (rows[-1].updated_at, rows[-1].id) if len(rows) == BATCH else None


def look_for_chains_lost_with_broker(hub: Hub, now: datetime) -> int:
    """When the broker lost the tasks it held (restarted empty, flushed: the mark the hub keeps in it is
    gone), every chain the store says is in it is due one poll interval from now instead of after
    OPENHUB_LEASE_GRACE. The re-drive then publishes again those whose task is in none of its queues and
    leaves those whose task is (openhub.engine.due): a chain whose step committed just before this look has
    had its task published by then, and is not published twice. The mark is put back once that is
    written, so a store away now leaves it to the next tick. How many were made due."""
    publisher = hub.publisher
    try:
        if publisher.broker_marked() is not False:
            return 0
    except Exception as exc:
        log.info("could not look at the broker's mark: %s", exc)
        return 0
    with hub.transaction() as conn:
        due = chains_in_broker_due(conn, now + hub.settings.poll_interval)
    publisher.mark_broker()
    log.log(
        logging.WARNING if due else logging.INFO,
        "the broker's mark was gone (restarted empty, flushed, or new): %d chain(s) the store says it held "
        "are looked for in its queues at the next tick, and published again where they are not",
        due,
    )
    return due


def expire_guaranteed_order(hub: Hub, now: datetime) -> int:
    """FAIL guaranteed-order messages blocked in their funnel longer than the route's order_timeout."""
    routes = [r for r in hub.registry.routes.values() if r.guaranteed_order and r.order_timeout]
    follow = FollowUps()
    expired = 0
    with hub.transaction() as conn:
        paused = paused_routes(conn)
        for route in routes:
            if is_paused(paused, route.name):  # waiting for an operator is not waiting in the funnel
                continue
            query = select(messages).where(
                and_(
                    M.service == route.service,
                    M.operation == route.operation,
                    M.funnel.is_not(None),
                    M.state.in_((State.POSTPONED.value,)),
                    M.blocked_since < now - route.order_timeout,
                )
            )
            if is_postgres(conn):
                query = query.with_for_update(skip_locked=True, key_share=True)
            for row in conn.execute(query.limit(BATCH)).all():
                apply_event(
                    Tx(conn, now, follow, hub),
                    row,
                    Event.ORDER_EXPIRED,
                    route,
                    error_code=codes.ORDER_TIMEOUT,
                    failed_error=f"blocked in funnel {row.funnel!r} longer than {route.order_timeout}",
                )
                expired += 1
    carry_out(hub, follow, now)
    return expired
