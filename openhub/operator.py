"""What operators do to messages and routes (the CLI and the HTTP API wrap these functions)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from sqlalchemy import and_, delete, func, not_, select, update

from . import leases, waits
from .context import MessageView
from .db import store_now, transaction
from .errors import InputError, NotFound, StateConflict
from .lifecycle import FollowUps, Tx, apply_event, cancel_family, redispatch
from .model import Route
from .producer import get_message, shallow
from .redrive import carry_out, redrive_due_messages
from .registry import get_registry
from .schema import messages, route_pauses
from .states import FINAL, NON_FINAL, Event, State, allowed
from .store import DRAIN, drain_reason, dumps, filtered, lock_message, pause_route, paused_routes

M = messages.c
RESUMABLE = (State.POSTPONED.value, State.PARTLY_FAILED.value, State.NEW.value)


def _locked(conn, message_id: int):  # noqa: ANN001, ANN202
    row = lock_message(conn, int(message_id))
    if row is None:
        raise NotFound(f"no message with id {message_id}")
    return row


def restart(message_id: int, total: bool = False) -> MessageView:
    """Restart a final message (OK, FAILED, CANCEL): failed count reset, retried at the next poll.

    `total=True` also forgets its OK external calls, so every call is made again (with new
    idempotency keys).
    """
    follow = FollowUps(redrive=[int(message_id)])
    with transaction() as conn:
        row = _locked(conn, message_id)
        if not allowed(State(row.state), Event.RESTARTED):
            raise StateConflict(f"message {message_id} is {row.state}: only an OK, FAILED or CANCEL message "
                                "can be restarted")
        now = store_now()
        # A run still in flight (the message was cancelled mid-step) keeps its lease: the new chain waits for it.
        values: dict[str, Any] = dict(due_at=now, finished_at=None, failed_error=None, failed_step=None,
                                      error_code=None, blocked_since=None, attempt_id=str(uuid.uuid4()),
                                      expires_at=None)  # restarted: carried out anyway
        if total:
            leases.forget_calls(conn, row)
            values.update(generation=row.generation + 1, custom_data=None, business_errors=None)
        # The history says who restarted it: the state it goes to (PARTLY_FAILED, due now) alone reads as a failure.
        apply_event(Tx(conn, now, follow), row, Event.RESTARTED, _route_of(row),
                    detail="total restart by an operator: every call made again" if total
                    else "restarted by an operator", **values)
    carry_out(follow, now)
    return get_message(message_id)


def cancel(message_id: int) -> MessageView:
    """Cancel a message in any non-final state; it is confirmed as CANCEL and its chain stops."""
    follow = FollowUps()
    with transaction() as conn:
        row = _locked(conn, message_id)
        if row.state in FINAL:
            raise StateConflict(f"message {message_id} is already {row.state}: only a message not final yet "
                                "can be cancelled")
        now = store_now()
        cancel_family(conn, row, now, follow)
    carry_out(follow, now)
    return get_message(message_id)


def _route_of(row: Any) -> Route | None:
    return get_registry().find_route_of(row)


BULK_LIMIT = 1000  # messages one bulk action acts on; `more` says when others match too


@dataclass
class BulkResult:
    """What a bulk action did: the messages it acted on, those it could not (why), and whether more match."""

    done: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    more: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "refused": [{"id": i, "reason": r} for i, r in self.refused.items()],
                "more": self.more}


def restart_matching(*, total: bool = False, limit: int = BULK_LIMIT, **filters: Any) -> BulkResult:
    """Restart every final message matching the filters (`openhub.list_messages`'), oldest first."""
    return _bulk(lambda i: restart(i, total=total), FINAL - {State.SKIPPED}, limit, filters)


def cancel_matching(*, limit: int = BULK_LIMIT, **filters: Any) -> BulkResult:
    """Cancel every non-final message matching the filters, oldest first."""
    return _bulk(cancel, NON_FINAL, limit, filters)


def _bulk(act: Callable[[int], Any], states: frozenset[State], limit: int, filters: dict[str, Any]) -> BulkResult:
    given = {k: v for k, v in filters.items() if v is not None}
    if not given:
        raise InputError("a bulk action needs at least one filter (state, route, source system, error code, ...)")
    if not 1 <= int(limit) <= BULK_LIMIT:
        raise InputError(f"limit must be 1..{BULK_LIMIT}")
    wanted = {s.value for s in states}
    if "state" in given:
        if given["state"] not in wanted:
            raise InputError(f"this action applies to messages in {', '.join(sorted(wanted))}, not {given['state']}")
        wanted = {given.pop("state")}
    with transaction() as conn:
        ids = list(conn.execute(filtered(select(M.id), states=wanted, **given).order_by(M.id).limit(int(limit) + 1))
                   .scalars())
    result = BulkResult(more=len(ids) > limit)
    for message_id in ids[:limit]:  # one transaction each: a message that moved on meanwhile is refused alone
        try:
            act(message_id)
            result.done.append(message_id)
        except (StateConflict, NotFound) as exc:
            result.refused[message_id] = str(exc)
    return result


def respond(message_id: int, payload: Any, *, token: str | None = None, by: str | None = None) -> MessageView:
    """Deliver the response a message waits for; its route resumes with ctx.response.

    `token` names the wait it answers (`ctx.wait_token` of the step that asked): the answer is taken for
    that wait only, also when it comes while the asking step still runs; a second answer with the same
    token is a duplicate (noted, not kept; the view returned says `duplicate`); one for a wait that has
    ended raises StaleResponse. Without a token the answer is taken only while the message waits and no
    answer was ever taken for it; anywhere else ResponseTokenNeeded (openhub.waits). `by` names who
    answered (the responding source system, or the operators) in the history.
    """
    shallow(payload, "response")
    try:
        text = dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InputError(f"response is not JSON-serialisable: {exc}") from None
    if token is not None and (not isinstance(token, str) or not 0 < len(token) <= 64 or not token.isprintable()):
        raise InputError("a wait token is the text ctx.wait_token gave, up to 64 printable characters")
    follow = FollowUps()
    with transaction() as conn:
        row = _locked(conn, message_id)
        now = store_now()
        received, detail = waits.receive(conn, row, token, text, now, by)
        if received is waits.Received.TAKEN:
            leases.responded(conn, row, now)
            redispatch(conn, row, Event.RESPONDED, now, follow, detail=detail)
    refusal = received.refusal(detail)
    if refusal is not None:  # raised once its note in the history is committed
        raise refusal
    carry_out(follow, now)
    return replace(get_message(message_id), duplicate=received is waits.Received.DUPLICATE)


def pause(route: str, reason: str = "paused by an operator") -> None:
    """Pause a route: none of its messages starts until `resume`."""
    get_registry().route(route)
    with transaction() as conn:
        pause_route(conn, route, reason, store_now())


def resume(route: str) -> int:
    """Resume a paused route; its postponed messages are re-driven now. Returns how many."""
    return _resume(route, get_registry().route(route))


def drain(reason: str = "drained by an operator") -> int:
    """Drain the hub before maintenance: new messages are refused (HTTP 503) and none starts, while
    the chains under way finish. Returns how many messages are still under way (PROCESSING)."""
    with transaction() as conn:
        pause_route(conn, DRAIN, reason, store_now())
    return drain_status()["under_way"]


def drain_status() -> dict[str, Any]:
    """Whether the hub is draining (and why), and how many messages are still under way."""
    with transaction() as conn:
        reason = drain_reason(conn)
        under_way = conn.execute(select(func.count()).select_from(messages)
                                 .where(M.state == State.PROCESSING.value)).scalar_one()
    return {"draining": reason is not None, "reason": reason, "under_way": under_way}


def undrain() -> int:
    """End a drain: messages are taken again and those it held back are re-driven now. Returns how many."""
    return _resume(DRAIN, None)


def _resume(name: str, route: Route | None) -> int:
    """Delete a pause (a route's, or the drain) and re-drive the messages it held back, now."""
    now = store_now()
    with transaction() as conn:
        conn.execute(delete(route_pauses).where(route_pauses.c.route == name))
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
            made_due = conn.execute(update(messages).where(and_(M.id.in_(ids), M.state.in_(RESUMABLE)))
                                    .values(due_at=now, blocked_since=None)).rowcount
    # Counted as made due, not as re-driven by this call: a poller's tick that commits between the two
    # transactions re-drives some of them itself (skipping the rows it holds locked), and they go on all the same.
    for i in range(0, len(ids), 500):
        redrive_due_messages(now, only_ids=ids[i:i + 500])
    return made_due


def paused() -> dict[str, str | None]:
    """Paused routes and why."""
    with transaction() as conn:
        return {r.route: r.reason for r in conn.execute(route_pauses.select())}


