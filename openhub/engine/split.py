"""The splitter's children: a parent message waits while its children are processed (seed 003).

Children are written in the transaction that sets the parent WAITING and are dispatched in
list order after commit; a sequential split's children wait their turn (NEW, no due time) and
each is made due when the one before it ends OK. How a child's end moves its family along
(`settle_parent`) is in openhub.engine.lifecycle, with every other change of a message's state.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, select

from openhub.core.errors import InputError, Reject
from openhub.core.model import Child, Route, Split
from openhub.core.states import State
from openhub.engine.hub import Hub
from openhub.engine.intake import insert_new_many, prepare, publish_new
from openhub.store.schema import messages

log = logging.getLogger("openhub.split")
M = messages.c


def prepare_children(hub: Hub, parent: Any, item: Split, children: list[Any], now: datetime) -> list[dict[str, Any]]:
    """Check a split's children and turn them into NEW rows; Reject names what is malformed."""
    if not children:
        raise Reject(f"split {item.key!r} returned no children")
    rows = []
    for i, child in enumerate(children):
        if not isinstance(child, Child):
            raise Reject(f"split {item.key!r} returned {child!r}, not a Child")
        if item.route is not None and child.route != item.route:
            raise Reject(f"split {item.key!r} may only create {item.route} children, not {child.route}")
        try:
            rows.append(
                prepare(
                    child.route,
                    child.payload,
                    source_system=parent.source_system,
                    correlation_id=f"{parent.correlation_id}#{parent.generation}.{i + 1}",
                    process_id=parent.process_id,
                    msg_timestamp=parent.msg_timestamp,
                    parent_id=parent.id,
                    object_id=child.object_id,
                    funnel=child.funnel,
                    entity_type=child.entity_type,
                    expires_at=parent.expires_at,
                    now=now,
                    traceparent=getattr(parent, "traceparent", None),
                    hub=hub,
                )
            )  # the family's one trace
        except InputError as exc:
            raise Reject(f"child #{i + 1} of split {item.key!r}: {exc}") from None
    return rows


def write_children(conn: Connection, parent_id: int, item: Split, rows: list[dict[str, Any]]) -> None:
    """Insert a split's children (a re-run of the split finds them stored and adds none)."""
    if item.sequential:  # only the first is due; each next one when the one before it is OK
        rows = rows[:1] + [dict(row, due_at=None) for row in rows[1:]]
    if None in insert_new_many(conn, rows):
        log.info("message %s: some children already existed (the split ran again)", parent_id)


def dispatch_children(hub: Hub, parent_id: int) -> None:
    """Publish the chains of a parent's NEW children in the order the split returned them."""
    with hub.transaction() as conn:
        rows = conn.execute(
            select(messages)
            .where(
                and_(M.parent_id == parent_id, M.state == State.NEW.value, M.due_at.is_not(None))
            )  # not those awaiting their turn
            .order_by(M.id)
        ).all()
    publish_new(hub, [(r.id, r._asdict()) for r in rows])


def split_of(route: Route | None) -> Split | None:
    """The split step of a route (the one its children came from), if it has one."""
    return next((s for s in route.steps if isinstance(s, Split)), None) if route is not None else None


def current_children(parent: Any) -> Any:
    """The WHERE clause of a parent's children of its current generation (a total restart starts anew)."""
    prefix = f"{parent.correlation_id}#{parent.generation}."
    return and_(M.parent_id == parent.id, M.correlation_id.startswith(prefix, autoescape=True))


def children_counts(conn: Connection, parent: Any) -> dict[str, int]:
    """How many of the parent's current children are in each state."""
    return dict(conn.execute(select(M.state, func.count()).where(current_children(parent)).group_by(M.state)).all())
