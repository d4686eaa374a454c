"""A message's life in the store: every change of a message's state is written here.

`apply_event` writes what the state table (openhub.core.states) says an event does to a message, and
carries out the table's actions that belong in the same transaction: a final state queues the
confirmation and settles the split family, HELD_BACK pauses the route. `redispatch` gives a message
a new chain, `cancel_family` ends a message with the family under it, `settle_parent` and `resume_split`
move a split's family along. Nothing here reaches outside the transaction: what has to happen once
it committed (send a confirmation, publish a chain, re-drive a message) is collected as data in
`FollowUps`, and `followups.carry_out` does it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, select

from openhub.core import codes
from openhub.core.model import Route, RouteStep, Split
from openhub.core.policy import chain_wait, retry_due, retry_policy
from openhub.core.states import FINAL, Action, Event, State, transition
from openhub.engine.leases import dropped
from openhub.engine.split import children_counts, current_children, split_of
from openhub.outbound.confirm import queue_confirmation
from openhub.store.queries import lock_message, pause_route, runs_lost_in_a_row, set_state, update_message
from openhub.store.schema import messages

if TYPE_CHECKING:
    from openhub.engine.hub import Hub

log = logging.getLogger("openhub.lifecycle")
M = messages.c


@dataclass
class FollowUps:
    """What committed writes ask for once they have committed, as data (`followups.carry_out` does it).

    Each has a backstop in the store should the process die before: the poller finds a queued
    confirmation, a due message and a NEW child on its own.
    """

    confirm: list[int] = field(default_factory=list)  # messages whose confirmation was queued
    children: list[int] = field(default_factory=list)  # split parents whose NEW children were written
    funnels: list[int] = field(default_factory=list)  # messages that left their funnel: the next one goes on
    redrive: list[int] = field(default_factory=list)  # messages made due now
    # (route, message, token, first step, the message's traceparent, its priority)
    chains: list[tuple[Route, int, str, int, str | None, int | None]] = field(default_factory=list)

    def merge(self, other: FollowUps) -> None:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))


@dataclass(frozen=True)
class Tx:
    """One transaction that writes message state: its connection, the time it writes at, what it
    asks for after commit, and the hub it runs in (its settings and routes: openhub.engine.hub)."""

    conn: Connection
    now: datetime
    follow: FollowUps
    hub: Hub


def apply_event(
    tx: Tx,
    row: Any,
    event: Event,
    route: Route | None,
    item: RouteStep | None = None,
    detail: str | None = None,
    *,
    keep_run: bool = False,
    settle: bool = True,
    lost_runs: int = 0,
    **values: Any,
) -> State:
    """Write the transition of `event` with the state table's verdict and carry out its actions:
    those of this transaction here, the rest noted in `tx.follow`. Returns the new state.

    `keep_run`: a final state leaves the message's step run in place (a cancelled step still calling
    out keeps its lease until it ends). `settle=False`: the caller settles the split parent itself.
    `lost_runs`: see `states.transition`.
    """
    settings = tx.hub.settings
    policy = retry_policy(route, item, settings)
    result = transition(
        row.state, event, row.failed_count, policy.max_fails, lost_runs=lost_runs, max_lost_runs=settings.max_lost_runs
    )
    values.setdefault("failed_count", result.failed_count)
    if Action.SCHEDULE_RETRY in result.actions and "due_at" not in values:
        values["due_at"] = retry_due(policy, result.failed_count, tx.now)
    if result.state in FINAL:
        values.update(due_at=None, finished_at=tx.now)
        if not keep_run:
            values.update(dropped())
    if Action.CONFIRM in result.actions:
        if confirmed_to_source(tx, row, result.state.value):
            queue_confirmation(tx.conn, row.id, result.state.value, tx.now)
            tx.follow.confirm.append(row.id)
        elif row.parent_id is None:
            log.info(
                "message %s (%s) ended %s; not confirmed: no confirmer for %s",
                row.id,
                row.correlation_id,
                result.state.value,
                row.source_system,
            )
        else:  # a split child: its parent is what the source system sent, and is confirmed
            log.debug(
                "message %s (%s) ended %s; not confirmed: a split child", row.id, row.correlation_id, result.state.value
            )
    set_state(
        tx.conn,
        row,
        event.value,
        result.state,
        step=item.key if item else None,
        detail=detail,
        now=tx.now,
        hooks=tx.hub.registry.hooks_for(result.state.value),
        **values,
    )
    if Action.PAUSE_ROUTE in result.actions and route is not None:
        pause_route(tx.conn, route.name, f"held back by message {row.id}: {detail}", tx.now)
    if Action.RELEASE_FUNNEL in result.actions and row.funnel is not None:
        tx.follow.funnels.append(row.id)
    if Action.DISPATCH_CHILDREN in result.actions:
        tx.follow.children.append(row.id)
    if Action.NOTIFY_PARENT in result.actions and row.parent_id is not None and settle:
        settle_parent(tx, row.parent_id)
    return result.state


def run_lost(tx: Tx, row: Any, route: Route, reason: str) -> None:
    """A step's run ended without an outcome (its worker died, or its task crashed): the message is tried
    again now, no failure counted (the hub's fault, not the message's), noted WORKER_LOST. Unless its
    step's runs were lost this way more than OPENHUB_MAX_LOST_RUNS times in a row: a step that takes its
    worker down each time ends FAILED instead of looping."""
    lost = runs_lost_in_a_row(tx.conn, row.id) + 1
    limit = tx.hub.settings.max_lost_runs
    if lost > limit:
        reason = (
            f"{reason}; its step's runs were lost {lost} times in a row (OPENHUB_MAX_LOST_RUNS={limit}): "
            "a step that takes its worker down with it?"
        )
    apply_event(
        tx,
        row,
        Event.LEASE_EXPIRED,
        route,
        detail=reason,
        lost_runs=lost,
        **dropped(),
        due_at=tx.now,
        failed_error=reason,
        error_code=codes.WORKER_LOST,
    )


def redispatch(tx: Tx, row: Any, event: Event, start: int = 0, detail: str | None = None) -> None:
    """Give a message a new fencing token and state IN_QUEUE; its chain (from step `start`) is published
    after commit. A run still in flight from a cancelled chain keeps its lease: the new chain waits for it.
    """
    route = tx.hub.registry.route_of(row)
    token = str(uuid.uuid4())
    handed_over: dict[str, Any] = {"worker": None} if row.step_run is None else {}  # a run in flight keeps its worker
    apply_event(
        tx,
        row,
        event,
        route,
        detail=detail,
        attempt_id=token,
        due_at=tx.now + chain_wait(event, tx.now - row.updated_at, tx.hub.settings),
        **handed_over,
    )
    tx.follow.chains.append(
        (route, row.id, token, start, getattr(row, "traceparent", None), getattr(row, "priority", None))
    )


def cancel_family(tx: Tx, row: Any) -> None:
    """Cancel a message, then its children not final yet (and theirs).

    A new token makes any chain still carrying the message stop without effect. A step already
    calling out cannot be stopped: its run keeps the lease (and the funnel) until it ends, so no
    restart runs the step a second time meanwhile. A run of an unknown worker cannot be waited for.
    """
    route = tx.hub.registry.find_route_of(row)
    apply_event(
        tx,
        row,
        Event.CANCELLED,
        route,
        attempt_id=str(uuid.uuid4()),
        keep_run=row.worker is not None and row.step_run is not None,
    )
    split = split_of(route)
    if split is not None and not split.bound:  # independent children are not cancelled with their parent
        return
    children = (
        tx.conn.execute(select(M.id).where(and_(M.parent_id == row.id, M.state.not_in(FINAL))).order_by(M.id))
        .scalars()
        .all()
    )
    for child_id in children:  # a cancelled parent's family is cancelled with it
        child = lock_message(tx.conn, child_id)
        if child is not None and child.state not in FINAL:
            cancel_family(tx, child)


def confirmed_to_source(tx: Tx, row: Any, state: str | None = None) -> bool:
    """Whether a final state of the message is confirmed to its source system: a top-level message's
    always (with a confirmer), a split child's only when its split asks (the source never sent its id);
    with the stock confirmation protocol, only the `states` its endpoint confirms."""
    confirmer = tx.hub.registry.confirmers.get(row.source_system)
    if confirmer is None:
        return False
    if state is not None and state not in getattr(confirmer, "states", (state,)):
        return False
    if row.parent_id is None:
        return True
    parent = tx.conn.execute(select(M.service, M.operation).where(M.id == row.parent_id)).first()
    split = split_of(tx.hub.registry.find_route_of(parent)) if parent is not None else None
    return split is not None and split.confirm_children


def settle_parent(tx: Tx, parent_id: int) -> None:
    """A child's final state was just written in this transaction: finalise or resume its parent if the
    family is complete (and so on up, for nested splits).

    Settling in the child's transaction, under the parent's row lock, means the parent is finalised once
    however many children finish together, and never forgotten if a worker dies after the commit.
    """
    conn = tx.conn
    parent = lock_message(conn, parent_id)
    if parent is None or parent.state != State.WAITING:
        return
    route = tx.hub.registry.route_of(parent)
    counts = children_counts(conn, parent)
    failed, cancelled = counts.get(State.FAILED, 0), counts.get(State.CANCEL, 0)
    split = split_of(route)
    if split is not None and split.sequential:
        if _next_turn(tx, parent, split, failed + cancelled):
            return
        counts = children_counts(conn, parent)  # those awaiting their turn may have been cancelled
        failed, cancelled = counts.get(State.FAILED, 0), counts.get(State.CANCEL, 0)
    if failed or cancelled:
        apply_event(
            tx,
            parent,
            Event.CHILD_FAILED,
            route,
            failed_error=f"{failed} child message(s) FAILED, {cancelled} cancelled",
            error_code=codes.CHILDREN_FAILED,
        )
    elif sum(counts.values()) == counts.get(State.OK, 0) + counts.get(State.SKIPPED, 0):
        start = next(i for i, s in enumerate(route.steps) if isinstance(s, Split)) + 1
        if start < len(route.steps):
            redispatch(tx, parent, Event.CHILDREN_OK, start)
        else:  # nothing after the split: the family's success is the parent's
            apply_event(tx, parent, Event.COMPLETED, route)


def _next_turn(tx: Tx, parent: Any, split: Split, failed: int) -> bool:
    """A sequential family: make the next child due when none runs; True while the family goes on.

    After a failure the children still awaiting their turn are cancelled (they never ran), so the
    parent ends now rather than waiting for them.
    """
    conn, now, follow = tx.conn, tx.now, tx.follow
    live = conn.execute(
        select(
            M.id,
            M.state,
            M.due_at,
            M.step_run,
            M.failed_count,
            M.funnel,
            M.parent_id,
            M.source_system,
            M.correlation_id,
        )
        .where(and_(current_children(parent), M.state.not_in([s.value for s in FINAL])))
        .order_by(M.id)
    ).all()
    waiting = [r for r in live if r.state in (State.NEW, State.PARTLY_FAILED) and r.due_at is None]
    if failed:
        for child in waiting:
            apply_event(
                tx,
                child,
                Event.CANCELLED,
                None,
                settle=False,
                detail=f"a child before it in sequential split of message {parent.id} failed",
            )
        return len(live) > len(waiting)  # a child still running ends first
    if len(live) > len(waiting):
        return True  # one child is under way
    if not waiting:
        return False
    update_message(conn, waiting[0].id, due_at=now, updated_at=now)  # the poller's backstop, if we die now
    follow.redrive.append(waiting[0].id)
    return True


def resume_split(tx: Tx, parent: Any, item: Split) -> bool:
    """A split already done runs again (a restart, a re-drive): go on only if all its children are OK.

    Otherwise its FAILED and cancelled children are restarted and the parent waits for the family again.
    """
    conn, now, follow = tx.conn, tx.now, tx.follow
    counts = children_counts(conn, parent)
    if sum(counts.values()) == counts.get(State.OK, 0) + counts.get(State.SKIPPED, 0):
        return True
    again = conn.execute(
        select(messages)
        .where(and_(current_children(parent), M.state.in_((State.FAILED.value, State.CANCEL.value))))
        .order_by(M.id)
    ).all()
    for n, child in enumerate(again):
        due = now if n == 0 or not item.sequential else None  # a sequential family goes on with its first
        # A cancelled child whose step was still calling out keeps that run (its lease): the child's
        # next claim waits for it, as after an operator's restart, instead of calling a second time.
        apply_event(
            tx,
            child,
            Event.RESTARTED,
            None,
            detail=f"parent {parent.id} restarted",
            due_at=due,
            finished_at=None,
            attempt_id=str(uuid.uuid4()),
        )
    route = tx.hub.registry.route_of(parent)
    apply_event(
        tx,
        parent,
        Event.SPLIT,
        route,
        item,
        **dropped(keep_worker=True),
        due_at=None,
        detail=f"waiting again for its children ({len(again)} restarted)",
    )
    follow.redrive.extend(c.id for c in again[: 1 if item.sequential else len(again)])
    return False
