"""What operators do to messages: restart (from a step, with an edited payload), retry now, cancel, answer a
wait, one message or every one matching filters (the CLI and the HTTP API wrap these functions).

What operators do to routes and the hub (pause, drain) is openhub.service.pauses, to the external systems'
breakers openhub.service.breakers; their functions are importable from here too, where they used to live."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from sqlalchemy import func, select

from openhub.core.context import MessageView
from openhub.core.errors import InputError, NotFound, StateConflict
from openhub.core.secret_fields import mask_fields
from openhub.core.states import FINAL, NON_FINAL, Event, Note, State, allowed
from openhub.core.topics import is_topic
from openhub.engine import leases, waits
from openhub.engine.followups import carry_out, redrive_due_messages
from openhub.engine.hub import Hub, given
from openhub.engine.intake import prepare, shallow
from openhub.engine.lifecycle import FollowUps, Tx, apply_event, cancel_family, redispatch
from openhub.service.breakers import breakers, open_breaker, reset_breaker
from openhub.service.pauses import drain, drain_status, pause, paused, resume, undrain
from openhub.service.reads import get_message
from openhub.store import audit
from openhub.store.queries import (
    MessageFilter,
    dumps,
    loads,
    lock_message,
    record_transition,
    update_message,
)
from openhub.store.schema import messages

__all__ = [  # the operator calls of all three modules (openhub.service.actions was their one home)
    "BULK_LIMIT",
    "BulkResult",
    "breakers",
    "cancel",
    "cancel_matching",
    "drain",
    "drain_status",
    "edit_payload",
    "open_breaker",
    "pause",
    "paused",
    "reset_breaker",
    "respond",
    "restart",
    "restart_from",
    "restart_matching",
    "resume",
    "retry_now",
    "undrain",
]

M = messages.c


def _locked(conn, message_id: int):
    row = lock_message(conn, int(message_id))
    if row is None:
        raise NotFound(f"no message with id {message_id}")
    return row


def restart(message_id: int, total: bool = False, *, audited: bool = True, hub: Hub | None = None) -> MessageView:
    """Restart a final message (OK, FAILED, CANCEL): failed count reset, retried at the next poll.

    `total=True` also forgets its OK external calls, so every call is made again (with new
    idempotency keys). `audited=False`: the caller (a bulk action) writes the audit entry. `hub`: the hub
    whose message it is (default: the process's), as for every action here.
    """
    hub = given(hub)
    follow = FollowUps(redrive=[int(message_id)])
    with hub.transaction() as conn:
        row = _restartable(hub, conn, message_id)
        now = hub.clock()
        if total:
            leases.forget_calls(conn, row)
        who = audit.current_actor().name
        _restarted(
            Tx(conn, now, follow, hub),
            row,
            f"total restart by {who}: every call made again" if total else f"restarted by {who}",
            total=total,
        )
        if audited:
            audit.record(
                conn,
                "message.restart",
                message_ids=[message_id],
                old={"state": row.state},
                new={"total": total},
                now=now,
            )
    carry_out(hub, follow, now)
    return get_message(message_id, hub=hub)


def _restartable(hub: Hub, conn: Any, message_id: int) -> Any:
    row = _locked(conn, message_id)
    if not allowed(State(row.state), Event.RESTARTED):
        raise StateConflict(
            f"message {message_id} is {row.state}: only an OK, FAILED or CANCEL message can be restarted"
        )
    if is_topic(hub.registry.find_route_of(row)):  # it did nothing to do again: its receivers did
        raise StateConflict(f"message {message_id} is a fan-out family: restart its receivers (its children)")
    return row


def _restarted(tx: Tx, row: Any, detail: str, *, total: bool = False, new_keys: bool = False) -> None:
    # A run still in flight (the message was cancelled mid-step) keeps its lease: the new chain waits for it.
    values: dict[str, Any] = dict(
        due_at=tx.now,
        finished_at=None,
        failed_error=None,
        failed_step=None,
        error_code=None,
        blocked_since=None,
        attempt_id=str(uuid.uuid4()),
        expires_at=None,
    )  # restarted: carried out anyway
    if total:
        # A sync route's result comes from the calls made again (a plain restart skips the steps done and
        # keeps the result their calls gave).
        values.update(generation=row.generation + 1, custom_data=None, business_errors=None, result=None)
    elif new_keys:  # the steps called again send new idempotency keys (the others are not called)
        values.update(generation=row.generation + 1, result=None)
    # The history says who restarted it: the state it goes to (PARTLY_FAILED, due now) alone reads as a failure.
    route = tx.hub.registry.find_route_of(row)
    apply_event(tx, row, Event.RESTARTED, route, detail=detail, **values)


def restart_from(message_id: int, step: str, *, hub: Hub | None = None) -> MessageView:
    """Restart a final message from its route's step `step`: the call records of that step and every later
    one are cleared (listed in the history as cleared by the operator), the earlier ones kept, so the steps
    before `step` are never called again and `step` onward once more, with new idempotency keys (a system
    that lost what it was sent must not answer the repeat as a duplicate).

    Refused (InputError) for a step the route does not have; (StateConflict) for a message not final, or a
    split parent with children not final yet.
    """
    hub = given(hub)
    follow = FollowUps(redrive=[int(message_id)])
    with hub.transaction() as conn:
        row = _restartable(hub, conn, message_id)
        route = hub.registry.route_of(row)
        keys = [s.key for s in route.steps]
        if step not in keys:
            raise InputError(f"route {route.name} has no step {step!r}; its steps are {', '.join(keys)}")
        live = conn.execute(
            select(func.count())
            .select_from(messages)
            .where(M.parent_id == row.id, M.state.not_in([s.value for s in FINAL]))
        ).scalar_one()
        if live:
            raise StateConflict(
                f"message {message_id} has {live} split children not final yet: restart it from a step once they are"
            )
        now = hub.clock()
        later = keys[keys.index(step) :]
        cleared = leases.forget_calls_of(conn, row, later)
        who = audit.current_actor().name
        record_transition(
            conn,
            row.id,
            Note.CALLS_CLEARED,
            row.state,
            row.state,
            step=step,
            now=now,
            detail=f"cleared by {who}: the call records of steps {', '.join(later)}: " + dumps(cleared),
        )
        _restarted(Tx(conn, now, follow, hub), row, f"restarted from step {step} by {who}", new_keys=True)
        audit.record(
            conn,
            "message.restart_from",
            message_ids=[message_id],
            target=f"step {step}",
            old={"state": row.state, "cleared": [c["key"] for c in cleared]},
            new={"from_step": step},
            now=now,
        )
    carry_out(hub, follow, now)
    return get_message(message_id, hub=hub)


def retry_now(message_id: int, *, hub: Hub | None = None) -> MessageView:
    """Make a PARTLY_FAILED or POSTPONED message due now instead of after its back-off; its failure count
    stays as it is. (A paused route or a drain still holds it.)"""
    hub = given(hub)
    with hub.transaction() as conn:
        row = _locked(conn, message_id)
        if row.state not in (State.PARTLY_FAILED.value, State.POSTPONED.value):
            raise StateConflict(
                f"message {message_id} is {row.state}: only a PARTLY_FAILED or POSTPONED message waits for a retry"
            )
        now = hub.clock()
        update_message(conn, row.id, due_at=now, updated_at=now)
        record_transition(
            conn,
            row.id,
            Note.RETRY_NOW,
            row.state,
            row.state,
            now=now,
            detail=f"made due now by {audit.current_actor().name} (was due {row.due_at})",
        )
        audit.record(
            conn,
            "message.retry_now",
            message_ids=[message_id],
            old={"due_at": str(row.due_at)},
            new={"due_at": str(now)},
            now=now,
        )
    redrive_due_messages(hub, now, only_ids=[int(message_id)])
    return get_message(message_id, hub=hub)


def edit_payload(message_id: int, payload: Any, *, hub: Hub | None = None) -> MessageView:
    """Replace a FAILED message's payload and restart it (from the step that failed, whose record the
    failure left unsuccessful). The new payload is checked as a submission's is (size, nesting, the route's
    validation); the old one is kept in the history (the route's secret fields masked)."""
    hub = given(hub)
    follow = FollowUps(redrive=[int(message_id)])
    with hub.transaction() as conn:
        row = _locked(conn, message_id)
        if row.state != State.FAILED.value:
            raise StateConflict(f"message {message_id} is {row.state}: only a FAILED message's payload is edited")
        route = hub.registry.route_of(row)
        checked = prepare(
            route.name,
            payload,
            source_system=row.source_system,
            correlation_id=row.correlation_id,
            parent_id=row.parent_id,
            object_id=row.object_id,
            funnel=row.funnel,
            hub=hub,
        )
        now = hub.clock()
        old = loads(row.payload)
        shown = mask_fields(old, route.secret_fields) if route.secret_fields else old
        who = audit.current_actor().name
        update_message(conn, row.id, payload=checked["payload"], updated_at=now)
        record_transition(
            conn,
            row.id,
            Note.PAYLOAD_EDITED,
            row.state,
            row.state,
            now=now,
            detail=f"payload replaced by {who}; the old payload: " + dumps(shown),
        )
        _restarted(Tx(conn, now, follow, hub), row, f"restarted by {who} with an edited payload")
        new_shown = mask_fields(payload, route.secret_fields) if route.secret_fields else payload
        audit.record(conn, "message.edit_payload", message_ids=[message_id], old=shown, new=new_shown, now=now)
    carry_out(hub, follow, now)
    return get_message(message_id, hub=hub)


def cancel(message_id: int, *, audited: bool = True, hub: Hub | None = None) -> MessageView:
    """Cancel a message in any non-final state; it is confirmed as CANCEL and its chain stops."""
    hub = given(hub)
    follow = FollowUps()
    with hub.transaction() as conn:
        row = _locked(conn, message_id)
        if row.state in FINAL:
            raise StateConflict(
                f"message {message_id} is already {row.state}: only a message not final yet can be cancelled"
            )
        now = hub.clock()
        cancel_family(Tx(conn, now, follow, hub), row)
        if audited:
            audit.record(conn, "message.cancel", message_ids=[message_id], old={"state": row.state}, now=now)
    carry_out(hub, follow, now)
    return get_message(message_id, hub=hub)


BULK_LIMIT = 1000  # messages one bulk action acts on; `more` says when others match too


@dataclass
class BulkResult:
    """What a bulk action did: the messages it acted on, those it could not (why), and whether more match."""

    done: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    more: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "refused": [{"id": i, "reason": r} for i, r in self.refused.items()],
            "more": self.more,
        }


def restart_matching(
    *, total: bool = False, limit: int = BULK_LIMIT, hub: Hub | None = None, **filters: Any
) -> BulkResult:
    """Restart every final message matching the filters (`openhub.list_messages`'), oldest first."""
    hub = given(hub)
    return _bulk(
        hub,
        "message.restart_matching",
        lambda i: restart(i, total=total, audited=False, hub=hub),
        FINAL - {State.SKIPPED},
        limit,
        MessageFilter(**filters),
        total,
    )


def cancel_matching(*, limit: int = BULK_LIMIT, hub: Hub | None = None, **filters: Any) -> BulkResult:
    """Cancel every non-final message matching the filters, oldest first."""
    hub = given(hub)
    return _bulk(
        hub,
        "message.cancel_matching",
        lambda i: cancel(i, audited=False, hub=hub),
        NON_FINAL,
        limit,
        MessageFilter(**filters),
    )


def _bulk(
    hub: Hub,
    action: str,
    act: Callable[[int], Any],
    states: frozenset[State],
    limit: int,
    matching: MessageFilter,
    total: bool = False,
) -> BulkResult:
    """Act on each matching message in a transaction of its own (a message that moved on meanwhile is refused
    alone); one audit entry names every message acted on, written once they are (a bulk action has no single
    transaction of its effect), and each message's history names who acted."""
    given = matching.given()
    if not given:
        raise InputError("a bulk action needs at least one filter (state, route, source system, error code, ...)")
    if not 1 <= int(limit) <= BULK_LIMIT:
        raise InputError(f"limit must be 1..{BULK_LIMIT}")
    wanted = {s.value for s in states}
    if matching.state is not None:
        if matching.state not in wanted:
            raise InputError(f"this action applies to messages in {', '.join(sorted(wanted))}, not {matching.state}")
        wanted = {matching.state}
    acting_on = replace(matching, state=None, states=frozenset(wanted))
    with hub.transaction() as conn:
        ids = list(conn.execute(acting_on.where(select(M.id)).order_by(M.id).limit(int(limit) + 1)).scalars())
    result = BulkResult(more=len(ids) > limit)
    for message_id in ids[:limit]:  # one transaction each: a message that moved on meanwhile is refused alone
        try:
            act(message_id)
            result.done.append(message_id)
        except (StateConflict, NotFound) as exc:
            result.refused[message_id] = str(exc)
    with hub.transaction() as conn:
        audit.record(
            conn,
            action,
            now=hub.clock(),
            message_ids=result.done,
            target=None,
            new={
                "filters": {k: str(v) for k, v in given.items()},
                "limit": int(limit),
                "total": total or None,
                "refused": sorted(result.refused),
                "more": result.more,
            },
        )
    return result


def respond(
    message_id: int, payload: Any, *, token: str | None = None, by: str | None = None, hub: Hub | None = None
) -> MessageView:
    """Deliver the response a message waits for; its route resumes with ctx.response.

    `token` names the wait it answers (`ctx.wait_token` of the step that asked): the answer is taken for
    that wait only, also when it comes while the asking step still runs; a second answer with the same
    token is a duplicate (noted, not kept; the view returned says `duplicate`); one for a wait that has
    ended raises StaleResponse. Without a token the answer is taken only while the message waits and no
    answer was ever taken for it; anywhere else ResponseTokenNeeded (openhub.engine.waits). `by` names who
    answered (the responding source system, or the operators) in the history.
    """
    hub = given(hub)
    shallow(payload, hub.settings, "response")
    try:
        text = dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InputError(f"response is not JSON-serialisable: {exc}") from None
    if token is not None and (not isinstance(token, str) or not 0 < len(token) <= 64 or not token.isprintable()):
        raise InputError("a wait token is the text ctx.wait_token gave, up to 64 printable characters")
    follow = FollowUps()
    with hub.transaction() as conn:
        row = _locked(conn, message_id)
        now = hub.clock()
        received, detail = waits.receive(conn, row, token, text, now, by)
        if audit.current_actor().role in audit.ROLES:  # an operator answered (a source system's answer is its own)
            audit.record(
                conn,
                "message.respond",
                message_ids=[message_id],
                new={"token": token, "outcome": received.name},
                now=now,
            )
        if received is waits.Received.TAKEN:
            leases.responded(conn, row, now)
            redispatch(Tx(conn, now, follow, hub), row, Event.RESPONDED, detail=detail)
    refusal = received.refusal(detail)
    if refusal is not None:  # raised once its note in the history is committed
        raise refusal
    carry_out(hub, follow, now)
    return replace(get_message(message_id, hub=hub), duplicate=received is waits.Received.DUPLICATE)
