"""The splitter: a parent message waits while its children are processed (seed 003).

Children are written in the transaction that sets the parent WAITING and are dispatched in
list order after commit; a sequential split's children wait their turn (NEW, no due time) and
each is made due when the one before it ends OK. Each child that reaches a final state re-checks
its parent under the parent's row lock, so children finishing together on several workers
finalise it once. Children are confirmed to the source system only when their split asks.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Connection, Row, and_, func, select

from .db import transaction, utcnow
from .errors import InputError, Reject
from .model import Child, Split
from .registry import get_registry
from .schema import messages
from .states import FINAL, Action, Event, State, transition
from .store import lock_message

log = logging.getLogger("openhub.split")
M = messages.c


def prepare_children(parent: Any, item: Split, children: list[Any], now: datetime) -> list[dict[str, Any]]:
    """Check a split's children and turn them into NEW rows; Reject names what is malformed."""
    from .producer import prepare

    if not children:
        raise Reject(f"split {item.key!r} returned no children")
    rows = []
    for i, child in enumerate(children):
        if not isinstance(child, Child):
            raise Reject(f"split {item.key!r} returned {child!r}, not a Child")
        if item.route is not None and child.route != item.route:
            raise Reject(f"split {item.key!r} may only create {item.route} children, not {child.route}")
        try:
            rows.append(prepare(child.route, child.payload, source_system=parent.source_system,
                                correlation_id=f"{parent.correlation_id}#{parent.generation}.{i + 1}",
                                process_id=parent.process_id, msg_timestamp=parent.msg_timestamp,
                                parent_id=parent.id, object_id=child.object_id, funnel=child.funnel,
                                entity_type=child.entity_type, expires_at=parent.expires_at, now=now))
        except InputError as exc:
            raise Reject(f"child #{i + 1} of split {item.key!r}: {exc}") from None
    return rows


def write_children(conn: Connection, parent_id: int, item: Split, rows: list[dict[str, Any]],
                   actions: set[Action]) -> None:
    """Insert a split's children (a re-run of the split finds them stored and adds none)."""
    from .producer import insert_new_many

    if item.sequential:  # only the first is due; each next one when the one before it is OK
        rows = rows[:1] + [dict(row, due_at=None) for row in rows[1:]]
    if None in insert_new_many(conn, rows):
        log.info("message %s: some children already existed (the split ran again)", parent_id)
    actions.add(Action.DISPATCH_CHILDREN)


def dispatch_children(parent_id: int) -> None:
    """Publish the chains of a parent's NEW children in the order the split returned them."""
    from .producer import publish_new

    with transaction() as conn:
        rows = conn.execute(select(messages).where(and_(M.parent_id == parent_id, M.state == State.NEW.value,
                                                        M.due_at.is_not(None)))  # not those awaiting their turn
                            .order_by(M.id)).all()
    publish_new([(r.id, r._asdict()) for r in rows])


def split_of(route_name: str) -> Split | None:
    """The split step of a route (the one its children came from), if it has one."""
    route = get_registry().routes.get(route_name)
    return next((s for s in route.steps if isinstance(s, Split)), None) if route is not None else None


def confirmed_to_source(conn: Connection, row: Any) -> bool:
    """Whether a final state of the message is confirmed to its source system: a top-level message's
    always (with a confirmer), a split child's only when its split asks (the source never sent its id)."""
    if row.source_system not in get_registry().confirmers:
        return False
    if row.parent_id is None:
        return True
    parent = conn.execute(select(M.service, M.operation).where(M.id == row.parent_id)).first()
    split = split_of(f"{parent.service}.{parent.operation}") if parent is not None else None
    return split is not None and split.confirm_children


def current_children(parent: Any) -> Any:
    """The WHERE clause of a parent's children of its current generation (a total restart starts anew)."""
    prefix = f"{parent.correlation_id}#{parent.generation}."
    return and_(M.parent_id == parent.id, M.correlation_id.startswith(prefix, autoescape=True))


def children_counts(conn: Connection, parent: Any) -> dict[str, int]:
    """How many of the parent's current children are in each state."""
    return dict(conn.execute(select(M.state, func.count()).where(current_children(parent)).group_by(M.state)).all())


def settle_parent(conn: Connection, parent_id: int, now: datetime, effects: Any) -> None:
    """A child's final state was just written in this transaction: finalise or resume its parent if the
    family is complete, and its own parent in turn (nested splits).

    Settling in the child's transaction, under the parent's row lock, means the parent is finalised once
    however many children finish together, and never forgotten if a worker dies after the commit.
    """
    from .engine import publish_all, redispatch

    parent = lock_message(conn, parent_id)
    if parent is None or parent.state != State.WAITING:
        return
    counts = children_counts(conn, parent)
    failed, cancelled = counts.get(State.FAILED, 0), counts.get(State.CANCEL, 0)
    split = split_of(f"{parent.service}.{parent.operation}")
    if split is not None and split.sequential:
        if _next_turn(conn, parent, split, failed + cancelled, now, effects):
            return
        counts = children_counts(conn, parent)  # those awaiting their turn may have been cancelled
        failed, cancelled = counts.get(State.FAILED, 0), counts.get(State.CANCEL, 0)
    if failed or cancelled:
        result = transition(parent.state, Event.CHILD_FAILED, parent.failed_count)
        _finish_parent(conn, parent, Event.CHILD_FAILED, result.state, now, effects,
                       failed_error=f"{failed} child message(s) FAILED, {cancelled} cancelled")
    elif sum(counts.values()) == counts.get(State.OK, 0) + counts.get(State.SKIPPED, 0):
        route = get_registry().route(f"{parent.service}.{parent.operation}")
        start = next(i for i, s in enumerate(route.steps) if isinstance(s, Split)) + 1
        if start >= len(route.steps):  # nothing after the split: the family's success is the parent's
            _finish_parent(conn, parent, Event.CHILDREN_OK, State.OK, now, effects)
        else:
            route, token, start = redispatch(conn, parent, Event.CHILDREN_OK, now, start)
            effects.later.append(partial(publish_all, [(route, parent.id, token, start)]))


def _next_turn(conn: Connection, parent: Any, split: Split, failed: int, now: datetime, effects: Any) -> bool:
    """A sequential family: make the next child due when none runs; True while the family goes on.

    After a failure the children still awaiting their turn are cancelled (they never ran), so the
    parent ends now rather than waiting for them.
    """
    from .confirm import queue_confirmation
    from .poller import redrive_due_messages
    from .store import set_state, update_message

    live = conn.execute(select(M.id, M.state, M.due_at, M.step_run, M.failed_count).where(and_(
        current_children(parent), M.state.not_in([s.value for s in FINAL]))).order_by(M.id)).all()
    waiting = [r for r in live if r.state in (State.NEW, State.PARTLY_FAILED) and r.due_at is None]
    if failed:
        for child in waiting:
            result = transition(child.state, Event.CANCELLED, child.failed_count)
            set_state(conn, child, Event.CANCELLED.value, result.state, now=now, due_at=None, finished_at=now,
                      detail=f"a child before it in sequential split of message {parent.id} failed")
            if split.confirm_children and parent.source_system in get_registry().confirmers:
                queue_confirmation(conn, child.id, result.state.value, now)
        return len(live) > len(waiting)  # a child still running ends first
    if len(live) > len(waiting):
        return True  # one child is under way
    if not waiting:
        return False
    update_message(conn, waiting[0].id, due_at=now, updated_at=now)  # the poller's backstop, if we die now
    effects.later.append(lambda: redrive_due_messages(utcnow(), only_ids=[waiting[0].id]))
    return True


def _finish_parent(conn: Connection, parent: Row, event: Event, state: State, now: datetime, effects: Any,
                   **values: Any) -> None:
    from .confirm import queue_confirmation, send_confirmations
    from .funnel import release_funnel
    from .store import set_state

    if confirmed_to_source(conn, parent):
        queue_confirmation(conn, parent.id, state.value, now)
        effects.later.append(partial(send_confirmations, parent.id))
    set_state(conn, parent, event.value, state, now=now, due_at=None, finished_at=now, step_run=None, **values)
    if parent.funnel is not None:
        effects.later.append(partial(release_funnel, parent.id))
    if parent.parent_id is not None:
        settle_parent(conn, parent.parent_id, now, effects)


def resume_split(conn: Connection, parent: Any, now: datetime, effects: Any) -> bool:
    """A split already done runs again (a restart, a re-drive): go on only if all its children are OK.

    Otherwise its FAILED and cancelled children are restarted and the parent waits for the family again.
    """
    from .poller import redrive_due_messages
    from .store import set_state

    counts = children_counts(conn, parent)
    if sum(counts.values()) == counts.get(State.OK, 0) + counts.get(State.SKIPPED, 0):
        return True
    again = conn.execute(select(messages).where(and_(current_children(parent),
                                                     M.state.in_((State.FAILED.value, State.CANCEL.value))))).all()
    split = split_of(f"{parent.service}.{parent.operation}")
    sequential = split is not None and split.sequential
    for n, child in enumerate(sorted(again, key=lambda c: c.id)):
        result = transition(child.state, Event.RESTARTED, child.failed_count)
        due = now if n == 0 or not sequential else None  # a sequential family goes on with its first
        set_state(conn, child, Event.RESTARTED.value, result.state, now=now, detail=f"parent {parent.id} restarted",
                  failed_count=0, due_at=due, finished_at=None, step_run=None, attempt_id=str(uuid.uuid4()))
    set_state(conn, parent, Event.SPLIT.value, State.WAITING, now=now, step_run=None, due_at=None,
              detail=f"waiting again for its children ({len(again)} restarted)")
    if again:
        ids = sorted(c.id for c in again)[:1] if sequential else [c.id for c in again]
        effects.later.append(lambda: redrive_due_messages(utcnow(), only_ids=ids))
    return False
