"""What operators do to messages and routes (the CLI and the HTTP API wrap these functions)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from sqlalchemy import Connection, and_, delete, func, not_, select, update

from .confirm import queue_confirmation
from .context import MessageView
from .db import is_postgres, transaction, utcnow
from .engine import Effects, after_commit, publish_all, redispatch
from .model import Route
from .errors import InputError, NotFound, StateConflict
from .producer import get_message, shallow
from .registry import get_registry
from .schema import ext_calls, messages, route_pauses
from .split import confirmed_to_source, settle_parent
from .states import FINAL, NON_FINAL, Action, CallState, Event, State, allowed, transition
from .store import (DRAIN, drain_reason, dumps, filtered, lock_message, message_view, paused_routes,
                    record_transition, set_state, update_message)

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
    with transaction() as conn:
        row = _locked(conn, message_id)
        result = transition(row.state, Event.RESTARTED, row.failed_count)
        now = utcnow()
        # A run still in flight (the message was cancelled mid-step) keeps its lease: the new chain waits for it.
        values: dict[str, Any] = dict(failed_count=result.failed_count, due_at=now, finished_at=None,
                                      failed_error=None, failed_step=None, error_code=None, blocked_since=None,
                                      attempt_id=str(uuid.uuid4()), expires_at=None)  # restarted: carried out anyway
        if total:
            conn.execute(delete(ext_calls).where(ext_calls.c.message_id == row.id))
            conn.execute(update(ext_calls).where(ext_calls.c.ok_message_id == row.id)
                         .values(ok_message_id=None, ok_msg_timestamp=None))
            values.update(generation=row.generation + 1, custom_data=None, business_errors=None)
        set_state(conn, row, Event.RESTARTED.value, result.state, now=now,
                  detail="total restart" if total else None, **values)
    from .poller import redrive_due_messages

    redrive_due_messages(utcnow(), only_ids=[int(message_id)])
    return get_message(message_id)


def cancel(message_id: int) -> MessageView:
    """Cancel a message in any non-final state; it is confirmed as CANCEL and its chain stops."""
    with transaction() as conn:
        row = _locked(conn, message_id)
        now = utcnow()
        cancelled = _cancel(conn, row, now)
        if row.parent_id is not None:
            settle_parent(conn, row.parent_id, now, cancelled[0][2])
    for route, cancelled_id, effects in cancelled:
        if route is not None:
            after_commit(route, cancelled_id, effects)
    return get_message(message_id)


def _cancel(conn: Connection, row: Any, now: datetime) -> list[tuple[Route | None, int, Effects]]:
    """Cancel a message and, after it, its children not final yet (theirs too): what each needs after commit."""
    result = transition(row.state, Event.CANCELLED, row.failed_count)
    confirmed = confirmed_to_source(conn, row)
    if confirmed:
        queue_confirmation(conn, row.id, result.state.value, now)
    # A new token makes any chain still carrying the message stop without effect. A step already
    # calling out cannot be stopped: its run keeps the lease (and the funnel) until it ends, so no
    # restart runs the step a second time meanwhile. A run of an unknown worker cannot be waited for.
    keep_run = {} if row.worker is not None and row.step_run is not None else {"step_run": None, "worker": None}
    set_state(conn, row, Event.CANCELLED.value, result.state, now=now, due_at=None, finished_at=now,
              attempt_id=str(uuid.uuid4()), **keep_run)
    effects = Effects(result.actions - {Action.NOTIFY_PARENT})  # the caller settles the parent
    if not confirmed:
        effects.discard(Action.CONFIRM)
    done = [(get_registry().routes.get(f"{row.service}.{row.operation}"), row.id, effects)]
    children = conn.execute(select(M.id).where(and_(M.parent_id == row.id, M.state.not_in(FINAL)))
                            .order_by(M.id)).scalars().all()
    for child_id in children:  # a cancelled parent's family is cancelled with it
        child = lock_message(conn, child_id)
        if child is not None and child.state not in FINAL:
            done.extend(_cancel(conn, child, now))
    return done


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


def respond(message_id: int, payload: Any) -> MessageView:
    """Deliver the response a WAITING_FOR_RES message waits for; its route resumes with ctx.response.

    A response that arrives while the step that will wait for it is still running is kept too.
    """
    shallow(payload, "response")
    try:
        text = dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InputError(f"response is not JSON-serialisable: {exc}") from None
    with transaction() as conn:
        row = _locked(conn, message_id)
        if row.state == State.PROCESSING and row.step_run is not None:
            # Faster than the step that asked for it: kept, and the step resumes when it records its wait.
            update_message(conn, row.id, response=text)
            record_transition(conn, row.id, "response_early", row.state, row.state)
            return message_view(conn, row.id)
        if not allowed(State(row.state), Event.RESPONDED):
            raise StateConflict(f"message {message_id} is {row.state}, not waiting for a response")
        update_message(conn, row.id, response=text)
        waiting = and_(ext_calls.c.message_id == row.id, ext_calls.c.state == CallState.WAITING.value)
        conn.execute(update(ext_calls).where(waiting)
                     .values(state=CallState.OK.value, ok_message_id=row.id, ok_msg_timestamp=row.msg_timestamp,
                             updated_at=utcnow()))
        route, token, start = redispatch(conn, row, Event.RESPONDED, utcnow())
    publish_all([(route, int(message_id), token, start)])
    return get_message(message_id)


def pause(route: str, reason: str = "paused by an operator") -> None:
    """Pause a route: none of its messages starts until `resume`."""
    get_registry().route(route)
    from sqlalchemy.dialects import postgresql, sqlite

    with transaction() as conn:
        dialect = postgresql if is_postgres(conn) else sqlite
        conn.execute(dialect.insert(route_pauses).values(route=route, paused_at=utcnow(), reason=reason)
                     .on_conflict_do_nothing(index_elements=["route"]))


def resume(route: str) -> int:
    """Resume a paused route; its postponed messages are re-driven now. Returns how many."""
    return _resume(route, get_registry().route(route))


def drain(reason: str = "drained by an operator") -> int:
    """Drain the hub before maintenance: new messages are refused (HTTP 503) and none starts, while
    the chains under way finish. Returns how many messages are still under way (PROCESSING)."""
    from sqlalchemy.dialects import postgresql, sqlite

    with transaction() as conn:
        dialect = postgresql if is_postgres(conn) else sqlite
        conn.execute(dialect.insert(route_pauses).values(route=DRAIN, paused_at=utcnow(), reason=reason)
                     .on_conflict_do_nothing(index_elements=["route"]))
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
    now = utcnow()
    with transaction() as conn:
        conn.execute(delete(route_pauses).where(route_pauses.c.route == name))
        paused = paused_routes(conn)
        if DRAIN in paused:  # still draining: the messages go on when it ends
            return 0
        query = messages.select().with_only_columns(M.id).where(M.state.in_(RESUMABLE))
        if route is not None:
            query = query.where(and_(M.service == route.service, M.operation == route.operation))
        for other in paused:  # routes paused on their own stay paused after a drain
            service, operation = other.split(".", 1)
            query = query.where(not_(and_(M.service == service, M.operation == operation)))
        ids = list(conn.execute(query).scalars())
        if ids:  # the time they spent paused was not time blocked in their funnel
            conn.execute(update(messages).where(and_(M.id.in_(ids), M.state.in_(RESUMABLE)))
                         .values(due_at=now, blocked_since=None))
    from .poller import redrive_due_messages

    redriven = 0
    for i in range(0, len(ids), 500):
        redriven += redrive_due_messages(now, only_ids=ids[i:i + 500])[0]
    return redriven


def paused() -> dict[str, str | None]:
    """Paused routes and why."""
    with transaction() as conn:
        return {r.route: r.reason for r in conn.execute(route_pauses.select())}


