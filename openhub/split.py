"""The splitter: a parent message waits while its children are processed (seed 003).

Children are written in the transaction that sets the parent WAITING and are dispatched in
list order after commit. Each child that reaches a final state re-checks its parent under the
parent's row lock, so children finishing together on several workers finalise it once.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, func, select

from .db import transaction, utcnow
from .errors import InputError, Reject
from .model import Child, Split
from .registry import get_registry
from .schema import messages
from .states import Action, Event, State, transition
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
                                entity_type=child.entity_type, now=now))
        except InputError as exc:
            raise Reject(f"child #{i + 1} of split {item.key!r}: {exc}") from None
    return rows


def write_children(conn: Connection, parent_id: int, rows: list[dict[str, Any]], actions: set[Action]) -> None:
    """Insert a split's children (a re-run of the split finds them stored and adds none)."""
    from .producer import insert_new_many

    if None in insert_new_many(conn, rows):
        log.info("message %s: some children already existed (the split ran again)", parent_id)
    actions.add(Action.DISPATCH_CHILDREN)


def dispatch_children(parent_id: int) -> None:
    """Publish the chains of a parent's NEW children in the order the split returned them."""
    from .producer import publish_new

    with transaction() as conn:
        rows = conn.execute(select(messages).where(and_(M.parent_id == parent_id, M.state == State.NEW.value))
                            .order_by(M.id)).all()
    publish_new([(r.id, r._asdict()) for r in rows])


def after_child_final(child_id: int) -> None:
    """A child reached a final state: finalise or resume its parent when the family is complete."""
    from .engine import publish_all, redispatch

    chains = []
    parent_id = None
    with transaction() as conn:
        child = conn.execute(select(M.parent_id).where(M.id == child_id)).first()
        if child is None or child.parent_id is None:
            return
        parent = lock_message(conn, child.parent_id)
        if parent is None or parent.state != State.WAITING:
            return
        counts = dict(conn.execute(select(M.state, func.count()).where(M.parent_id == parent.id)
                                   .group_by(M.state)).all())
        now = utcnow()
        if counts.get(State.FAILED, 0) or counts.get(State.CANCEL, 0):
            _fail_parent(conn, parent, now, counts)
            parent_id = parent.id
        elif sum(counts.values()) == counts.get(State.OK, 0) + counts.get(State.SKIPPED, 0):
            route = get_registry().route(f"{parent.service}.{parent.operation}")
            start = next(i for i, s in enumerate(route.steps) if isinstance(s, Split)) + 1
            if start >= len(route.steps):
                _complete_parent(conn, parent, now)
                parent_id = parent.id
            else:
                route, token, start = redispatch(conn, parent, Event.CHILDREN_OK, now, start)
                chains.append((route, parent.id, token, start))
    publish_all(chains)
    if parent_id is not None:
        _after_parent_final(parent_id)


def _fail_parent(conn: Connection, parent: Row, now: datetime, counts: dict[str, int]) -> None:
    from .confirm import queue_confirmation
    from .store import set_state

    result = transition(parent.state, Event.CHILD_FAILED, parent.failed_count)
    queue_confirmation(conn, parent.id, result.state.value, now)
    set_state(conn, parent, Event.CHILD_FAILED.value, result.state, now=now, due_at=None, finished_at=now,
              failed_error=f"{counts.get(State.FAILED, 0)} child message(s) FAILED, "
                           f"{counts.get(State.CANCEL, 0)} cancelled")


def _complete_parent(conn: Connection, parent: Row, now: datetime) -> None:
    from .confirm import queue_confirmation
    from .store import set_state

    queue_confirmation(conn, parent.id, State.OK.value, now)
    set_state(conn, parent, Event.CHILDREN_OK.value, State.OK, now=now, due_at=None, finished_at=now)


def _after_parent_final(parent_id: int) -> None:
    from .confirm import send_confirmations

    send_confirmations(parent_id)
    after_child_final(parent_id)  # nested splits: the parent may itself be a child
