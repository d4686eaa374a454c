"""What holds messages back for an operator: a paused route (none of its messages starts until it is resumed)
and the drain before maintenance (new messages refused; by default no stored one starts either). Ending either
re-drives, now, the messages it held back. (Holds of workers and hosts: openhub.service.worker_states.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, delete, func, not_, select, update

from openhub.core.model import Route
from openhub.core.states import State
from openhub.engine.followups import redrive_due_messages
from openhub.engine.hub import Hub, given
from openhub.store import audit
from openhub.store.queries import DRAIN, drain_reason, pause_route, paused_routes
from openhub.store.schema import messages, route_pauses

M = messages.c
RESUMABLE = (State.POSTPONED.value, State.PARTLY_FAILED.value, State.NEW.value)


def pause(route: str, reason: str = "paused by an operator", *, hub: Hub | None = None) -> None:
    """Pause a route: none of its messages starts until `resume`."""
    hub = given(hub)
    hub.registry.route(route)
    with hub.transaction() as conn:
        now = hub.clock()
        audit.record(
            conn,
            "route.pause",
            target=route,
            old={"paused": route in paused_routes(conn)},
            new={"paused": True, "reason": reason},
            now=now,
        )
        pause_route(conn, route, reason, now)


def resume(route: str, *, hub: Hub | None = None) -> int:
    """Resume a paused route; its postponed messages are re-driven now. Returns how many."""
    hub = given(hub)
    return _resume(hub, route, hub.registry.route(route))


def drain(reason: str = "drained by an operator", hold_retries: bool = True, *, hub: Hub | None = None) -> int:
    """Drain the hub before maintenance: new messages are refused (HTTP 503), while the chains under way
    finish. `hold_retries` (the default): no stored message starts either (a retry, a postponed or NEW one)
    until the drain ends; False: only new messages are refused, the stored ones go on. Draining again
    switches between the two (the first reason is kept). Returns how many messages are still under way."""
    hub = given(hub)
    with hub.transaction() as conn:
        now = hub.clock()
        audit.record(
            conn,
            "hub.drain",
            target="drain",
            old={"draining": drain_reason(conn) is not None, "hold_retries": DRAIN in paused_routes(conn)},
            new={"draining": True, "reason": reason, "hold_retries": hold_retries},
            now=now,
        )
        pause_route(conn, DRAIN, reason, now)
        conn.execute(
            update(route_pauses).where(route_pauses.c.route == DRAIN).values(intake_only=None if hold_retries else True)
        )
    return drain_status(hub=hub)["under_way"]


def drain_status(*, hub: Hub | None = None) -> dict[str, Any]:
    """Whether the hub is draining (and why, and whether it holds the stored messages back too), and how
    many messages are still under way."""
    with given(hub).transaction() as conn:
        reason = drain_reason(conn)
        holding = DRAIN in paused_routes(conn)
        under_way = conn.execute(
            select(func.count()).select_from(messages).where(M.state == State.PROCESSING.value)
        ).scalar_one()
    return {"draining": reason is not None, "reason": reason, "hold_retries": holding, "under_way": under_way}


def undrain(*, hub: Hub | None = None) -> int:
    """End a drain: messages are taken again and those it held back are re-driven now. Returns how many."""
    return _resume(given(hub), DRAIN, None)


def _resume(hub: Hub, name: str, route: Route | None) -> int:
    """Delete a pause (a route's, or the drain) and re-drive the messages it held back, now."""
    now = hub.clock()
    with hub.transaction() as conn:
        was = name in paused_routes(conn)
        if name == DRAIN:
            draining = drain_reason(conn) is not None
        conn.execute(delete(route_pauses).where(route_pauses.c.route == name))
        if name == DRAIN:
            audit.record(
                conn, "hub.undrain", target="drain", old={"draining": draining}, new={"draining": False}, now=now
            )
            if not was:  # it refused new messages only: it held none back
                return 0
        else:
            audit.record(conn, "route.resume", target=name, old={"paused": was}, new={"paused": False}, now=now)
        paused = paused_routes(conn)
        if DRAIN in paused:  # still draining: the messages go on when it ends
            return 0
        # Only what waits for a time: a sequential split's children awaiting their turn have none, and
        # starting them now would run them beside the child before them.
        query = messages.select().with_only_columns(M.id).where(and_(M.state.in_(RESUMABLE), M.due_at.is_not(None)))
        if route is not None:
            query = query.where(and_(M.service == route.service, M.operation == route.operation))
        for other in paused:  # routes paused on their own stay paused after a drain
            service, operation = other.split(".", 1)
            query = query.where(not_(and_(M.service == service, M.operation == operation)))
        ids = list(conn.execute(query).scalars())
        made_due = 0
        if ids:  # the time they spent paused was not time blocked in their funnel
            made_due = conn.execute(
                update(messages)
                .where(and_(M.id.in_(ids), M.state.in_(RESUMABLE)))
                .values(due_at=now, blocked_since=None)
            ).rowcount
    # Counted as made due, not as re-driven by this call: a poller's tick that commits between the two
    # transactions re-drives some of them itself (skipping the rows it holds locked), and they go on all the same.
    for i in range(0, len(ids), 500):
        redrive_due_messages(hub, now, only_ids=ids[i : i + 500])
    return made_due


def paused(*, hub: Hub | None = None) -> dict[str, str | None]:
    """Paused routes and why."""
    with given(hub).transaction() as conn:
        return {r.route: r.reason for r in conn.execute(route_pauses.select())}
