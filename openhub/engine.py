"""Carrying a message through one step of its route (DESIGN.md §3).

A step runs in three parts: `enter` (claim the message or check the chain's fencing token,
take the step lease, consult the step's external-call record), the step itself outside any
transaction, and `record` (write the outcome, if the lease is still ours). Every state change
goes through `states.transition`, so the rules live in one table.
"""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from dataclasses import dataclass, field
from functools import partial
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Callable

from sqlalchemy import Connection, Row, and_, bindparam, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from . import dispatch
from .confirm import queue_confirmation, send_confirmations
from .config import get_settings
from .context import MessageInfo, NoEffect, StepContext, WaitForResponse, aware
from .db import is_postgres, transaction, utcnow
from .errors import Holdback, Postpone, Reject, StoreUnavailable
from .funnel import funnel_blocked, release_funnel
from .model import RetryPolicy, Route, RouteStep, Split
from .registry import get_registry
from .schema import ext_calls, messages, route_pauses
from .split import dispatch_children, prepare_children, resume_split, settle_parent, write_children
from .states import Action, Event, State, transition
from .store import dumps, loads, lock_message, paused_routes, record_transition, set_state, update_message

log = logging.getLogger("openhub.engine")
X = ext_calls.c
RECORD_ATTEMPTS = 12  # about a minute of back-off in all


class Effects(set):
    """The actions of committed transitions, and follow-ups to run once the transaction committed."""

    def __init__(self, actions: Any = ()) -> None:
        super().__init__(actions)
        self.later: list[Callable[[], Any]] = []


@dataclass
class Entered:
    """A step that may run: the lease is ours and its context is ready."""

    run_id: str
    key: str
    ctx: StepContext
    row: SimpleNamespace
    started: float = field(default_factory=time.monotonic)


@dataclass
class Verdict:
    """How a step ended, as the engine records it."""

    event: Event | None  # None: the step succeeded and the route goes on
    error: str | None = None
    delay: timedelta | None = None
    children: list[Any] = field(default_factory=list)


def retry_policy(route: Route, item: RouteStep | None) -> RetryPolicy:
    """The retry policy of a step: its own, else its route's, else the OPENHUB_* defaults."""
    if item is not None and item.retry is not None:
        return item.retry
    if route.retry is not None:
        return route.retry
    s = get_settings()
    return RetryPolicy(max_fails=s.max_fails, interval=s.retry_interval or timedelta(seconds=1))


def step_timeout(item: RouteStep) -> timedelta:
    """How long one run of the step may take before Celery interrupts it."""
    return item.timeout or get_settings().step_timeout


def idempotency_key(row: Row, item: RouteStep) -> str:
    """Stable per message and step (and per total restart), for external systems' own dedup."""
    key = f"{row.source_system}/{row.correlation_id}/{item.key}"
    return f"{key}/{row.generation}" if row.generation else key


def call_key(row: Row, item: RouteStep, ctx: StepContext) -> str:
    """The external-call record a step is guarded by, by its scope."""
    if item.scope == "entity":
        if row.object_id is None:
            raise Reject(f"step {item.key!r} has entity scope but message {row.id} has no object_id")
        return f"entity:{row.entity_type}:{row.object_id}:{item.key}"
    if item.scope == "custom":
        return f"custom:{item.custom_key(ctx)}:{item.key}"  # type: ignore[misc]
    return f"msg:{row.id}:{item.key}"


def _info(row: Row) -> MessageInfo:
    return MessageInfo(id=row.id, correlation_id=row.correlation_id, source_system=row.source_system,
                       service=row.service, operation=row.operation, object_id=row.object_id,
                       entity_type=row.entity_type, process_id=row.process_id, failed_count=row.failed_count,
                       received_at=aware(row.received_at), msg_timestamp=aware(row.msg_timestamp),
                       parent_id=row.parent_id)


def run_step(route_name: str, index: int, message_id: int, token: str, redelivered: bool = False) -> bool:
    """Run step `index` of the route for the message; True when the chain should go on."""
    route = get_registry().route(route_name)
    item = route.steps[index]
    actions = Effects()
    # Committed without waiting for the WAL flush: if it is lost in a crash, so is everything after
    # it (WAL order), and the record of the step's outcome below is a synchronous commit.
    with transaction(async_commit=True) as conn:
        entered = _enter(conn, route, index, message_id, token, redelivered, actions)
    if not isinstance(entered, Entered):
        after_commit(route, message_id, actions)
        return bool(entered)
    verdict = _run(item, entered.ctx)
    if verdict.event is Event.SPLIT:
        try:
            verdict.children = prepare_children(entered.row, item, verdict.children, utcnow())
        except Reject as exc:
            verdict = Verdict(Event.REJECTED, error=f"Reject: {exc.reason}")
    # The step has run: its outcome must be written, or a repair would make the call again. The
    # lease is still ours, so a transaction lost to a deadlock or a database blip is simply retried.
    for attempt in range(RECORD_ATTEMPTS):
        recorded = Effects()
        try:
            with transaction() as conn:
                go_on = _record(conn, route, index, message_id, token, entered, verdict, recorded)
            break
        except StoreUnavailable as exc:
            if attempt == RECORD_ATTEMPTS - 1:
                raise
            log.warning("message %s: recording step %s failed (%s); retrying", message_id, item.key, exc)
            time.sleep(min(0.05 * 2 ** attempt, 5.0))  # back off from a conflict or an outage
    after_commit(route, message_id, recorded)
    return go_on


def _enter(conn: Connection, route: Route, index: int, message_id: int, token: str, redelivered: bool,
           actions: set[Action]) -> Entered | bool:
    now = utcnow()
    item = route.steps[index]
    run_id = str(uuid.uuid4())
    lease = dict(step_run=run_id, due_at=now + step_timeout(item) + get_settings().lease_grace, updated_at=now)
    row = _take_lease(conn, message_id, token, now, lease)
    if row is None:  # not a chain going on to its next step: find out why, under the row lock
        row = lock_message(conn, message_id)
        if row is None or row.attempt_id != token:
            log.info("message %s: stale chain (token changed), stopping without effect", message_id)
            return False
        if row.state not in (State.NEW, State.IN_QUEUE):
            log.info("message %s is %s%s: this chain stops", message_id, row.state,
                     " and another run holds the step lease" if row.state == State.PROCESSING else "")
            return False
        if not _claim(conn, row, route, item, now, lease, actions):
            return False
        row = _with(row, state=State.PROCESSING.value, attempts=row.attempts + 1,
                    started_at=row.started_at or now, **lease)
    custom_data = loads(row.custom_data, {})
    ctx = StepContext(payload=loads(row.payload), message=_info(row), idempotency_key=idempotency_key(row, item),
                      attempt=1, redelivered=redelivered, custom_data=custom_data, response=loads(row.response))
    try:
        key = call_key(row, item, ctx)
    except Exception as exc:  # a custom key that cannot be computed is the message's fault
        _finish(conn, row, route, item, Verdict(Event.REJECTED, error=f"{exc}"), now, actions)
        return False
    call = _take_call(conn, key, row, item, now)
    if call is not None and call.state == "OK":
        if call.message_id == row.id:
            if isinstance(item, Split) and not resume_split(conn, row, now, actions):
                return False
            log.debug("message %s: step %s already OK, skipped", message_id, item.key)
            if index == len(route.steps) - 1:
                _finish(conn, row, route, item, Verdict(Event.COMPLETED), now, actions)
                return False
            update_message(conn, row.id, step_run=None, due_at=now + get_settings().lease_grace, updated_at=now)
            return True
        if (call.msg_timestamp, call.message_id) > (row.msg_timestamp, row.id):
            apply_event(conn, row, Event.OBSOLETE, route, item, now, actions, step_run=None, due_at=None,
                        finished_at=now, detail=f"newer message {call.message_id} already did {key}")
            return False
    if call is not None and call.state == "PROCESSING" and call.message_id != row.id:
        other = conn.execute(select(messages.c.state, messages.c.step_run, messages.c.due_at)
                             .where(messages.c.id == call.message_id)).first()
        if other is not None and other.state == State.PROCESSING and other.step_run and other.due_at > now:
            # Two versions of one entity must not call the system at once; the older would win.
            apply_event(conn, row, Event.POSTPONED, route, item, now, actions, step_run=None,
                        detail=f"{key} is being called by message {call.message_id}",
                        due_at=now + get_settings().postpone_interval)
            return False
    if call is not None:
        ctx.attempt = call.attempts + 1 if call.message_id == row.id else 1
        conn.execute(update(ext_calls).where(X.key == key).values(
            state="PROCESSING", message_id=row.id, msg_timestamp=row.msg_timestamp, updated_at=now,
            attempts=ctx.attempt))
    return Entered(run_id=run_id, key=key, ctx=ctx, row=_with(row))


_LEASE = (update(messages).where(and_(
    messages.c.id == bindparam("mid"), messages.c.attempt_id == bindparam("token"),
    messages.c.state == State.PROCESSING.value,
    or_(messages.c.step_run.is_(None), messages.c.due_at < bindparam("now"))))
    .values(step_run=bindparam("run"), due_at=bindparam("lease_until"), updated_at=bindparam("now"))
    .returning(*messages.c))


def _take_lease(conn: Connection, message_id: int, token: str, now: datetime, lease: dict[str, Any]) -> Row | None:
    """The common case in one statement: the chain carrying the message takes the next step's lease."""
    return conn.execute(_LEASE, {"mid": message_id, "token": token, "now": now, "run": lease["step_run"],
                                 "lease_until": lease["due_at"]}).first()


def _claim(conn: Connection, row: Row, route: Route, item: RouteStep, now: datetime, lease: dict[str, Any],
           actions: set[Action]) -> bool:
    """The chain's first task takes a NEW/IN_QUEUE message, unless its route is paused or its funnel busy."""
    blocked = "route paused" if route.name in paused_routes(conn) else funnel_blocked(conn, row, route)
    if blocked and route.order_timeout and row.funnel and row.received_at < now - route.order_timeout:
        apply_event(conn, row, Event.ORDER_EXPIRED, route, item, now, actions, detail=blocked,
                    failed_error=f"blocked in funnel {row.funnel!r} longer than {route.order_timeout}: {blocked}")
        return False
    if blocked:
        apply_event(conn, row, Event.POSTPONED, route, item, now, actions, detail=blocked,
                    due_at=now + get_settings().postpone_interval)
        return False
    apply_event(conn, row, Event.CLAIMED, route, item, now, actions, attempts=row.attempts + 1,
                started_at=row.started_at or now, **lease)
    return True


def _with(row: Any, **values: Any) -> SimpleNamespace:
    """A copy of a message row with some columns changed (what this transaction wrote)."""
    data = dict(row._mapping) if hasattr(row, "_mapping") else dict(vars(row))
    data.update(values)
    return SimpleNamespace(**data)


def _take_call(conn: Connection, key: str, row: Any, item: RouteStep, now: datetime) -> Row | None:
    """The earlier external-call record for `key`, locked; None when this is the first call.

    A first call inserts its record (PROCESSING, attempt 1) in the same statement.
    """
    pg = is_postgres(conn)
    inserted = conn.execute(_NEW_CALL[pg], {
        "key": key, "message_id": row.id, "step_key": item.key, "scope": item.scope, "state": "PROCESSING",
        "msg_timestamp": row.msg_timestamp, "attempts": 1, "created_at": now, "updated_at": now}).first()
    if inserted is not None:
        return None
    return conn.execute(_LOCK_CALL[pg], {"call_key": key}).one()


_NEW_CALL = {pg: (postgresql if pg else sqlite).insert(ext_calls).on_conflict_do_nothing(index_elements=["key"])
             .returning(X.id) for pg in (False, True)}
_LOCK_CALL = {False: select(ext_calls).where(X.key == bindparam("call_key")),
              True: select(ext_calls).where(X.key == bindparam("call_key")).with_for_update()}


def _run(item: RouteStep, ctx: StepContext) -> Verdict:
    try:
        if isinstance(item, Split):
            children = item.fn(ctx)
            return Verdict(Event.SPLIT, children=list(children or []))
        item.fn(ctx)
        return Verdict(None)
    except WaitForResponse as exc:
        return Verdict(Event.WAIT_RESPONSE, delay=exc.timeout)
    except NoEffect:
        return Verdict(Event.NO_EFFECT, error="no effect")
    except Reject as exc:
        return Verdict(Event.REJECTED, error=f"Reject: {exc.reason}" + (f" [{exc.code}]" if exc.code else ""))
    except Postpone as exc:
        return Verdict(Event.POSTPONED, delay=exc.delay, error=exc.reason)
    except Holdback as exc:
        return Verdict(Event.HELD_BACK, error=exc.reason)
    except Exception:  # every other exception is transient: a fault to retry, not a verdict
        return Verdict(Event.TRANSIENT, error=traceback.format_exc())


def _record(conn: Connection, route: Route, index: int, message_id: int, token: str, entered: Entered,
            verdict: Verdict, actions: set[Action]) -> bool:
    item = route.steps[index]
    now = utcnow()
    ctx = entered.ctx
    row = entered.row  # still accurate: the step lease kept everyone else off the message
    duration = int((time.monotonic() - entered.started) * 1000)
    succeeded = verdict.event in (None, Event.SPLIT, Event.WAIT_RESPONSE)
    # A failed attempt's business errors are not kept: the retry reports them again if they still hold.
    errors = loads(row.business_errors, []) + (ctx.business_errors if succeeded else [])
    common = dict(custom_data=dumps(ctx.custom_data), business_errors=dumps(errors) if errors else None,
                  step_run=None, updated_at=now)
    last = index == len(route.steps) - 1
    if verdict.event is None and not last:
        common["due_at"] = now + get_settings().lease_grace  # the next step's task must arrive by then
    # Compare-and-set: the outcome counts only if the lease is still ours (no cancel, no repair).
    kept = conn.execute(_KEEP, {"mid": message_id, "token": token, "run": entered.run_id, **common}).first()
    if kept is None:
        log.warning("message %s: step %s finished after its lease was lost; outcome discarded", message_id, item.key)
        if verdict.event is None:  # the call did succeed: a later run must not make it again
            conn.execute(update(ext_calls).where(and_(X.key == entered.key, X.message_id == row.id,
                                                      X.state == "PROCESSING")).values(state="OK", updated_at=now))
        return False
    # A waiting step is OK once its response arrives; a response timeout makes it FAILED (re-sent).
    call_state = {None: "OK", Event.SPLIT: "OK", Event.WAIT_RESPONSE: "WAITING", Event.NO_EFFECT: "NO_EFFECT",
                  Event.POSTPONED: "POSTPONED", Event.HELD_BACK: "POSTPONED"}.get(verdict.event, "FAILED")
    error = verdict.error[-4000:] if verdict.error and call_state == "FAILED" else None
    conn.execute(_CALL_DONE, {"call_key": entered.key, "mid": row.id, "state": call_state, "updated_at": now,
                              "duration_ms": duration, "last_error": error})
    if call_state in ("OK", "WAITING"):
        record_transition(conn, row.id, "step_ok", row.state, row.state, step=item.key, now=now)
    if verdict.event is None and not last:
        return True
    answered_meanwhile = verdict.event is Event.WAIT_RESPONSE and kept.response != row.response
    row = _with(row, **common)
    _finish(conn, row, route, item, verdict if verdict.event else Verdict(Event.COMPLETED), now, actions)
    if answered_meanwhile:  # the response came while the step ran: no need to wait for it
        conn.execute(update(ext_calls).where(and_(X.key == entered.key, X.message_id == row.id))
                     .values(state="OK", updated_at=now))
        again, token, start = redispatch(conn, _with(row, state=State.WAITING_FOR_RES.value), Event.RESPONDED, now)
        actions.later.append(partial(publish_all, [(again, row.id, token, start)]))
    return False


# Compare-and-set of a step's outcome: written only while the step's lease is still this run's.
_KEEP = (update(messages).where(and_(
    messages.c.id == bindparam("mid"), messages.c.attempt_id == bindparam("token"),
    messages.c.step_run == bindparam("run"), messages.c.state == State.PROCESSING.value))
    .returning(messages.c.response))
_CALL_DONE = update(ext_calls).where(and_(X.key == bindparam("call_key"), X.message_id == bindparam("mid")))


def _finish(conn: Connection, row: Row, route: Route, item: RouteStep, verdict: Verdict, now: datetime,
            actions: set[Action], **values: Any) -> None:
    """Apply a verdict that ends this chain: final state, retry, postpone, wait or split."""
    settings = get_settings()
    event = verdict.event
    assert event is not None
    values.update(step_run=None)
    if event in (Event.TRANSIENT, Event.REJECTED, Event.NO_EFFECT):
        values.update(failed_step=item.key, failed_error=verdict.error)
    if event is Event.POSTPONED:
        values["due_at"] = now + (verdict.delay or settings.postpone_interval)
    elif event is Event.HELD_BACK:
        values["due_at"] = now + settings.postpone_interval
        _pause(conn, route.name, f"held back by message {row.id}: {verdict.error}", now)
    elif event is Event.WAIT_RESPONSE:
        values["due_at"] = now + (verdict.delay or settings.step_timeout)
    elif event is Event.NO_EFFECT:
        values["due_at"] = now + retry_policy(route, item).interval
    elif event is Event.SPLIT:
        values["due_at"] = None
        write_children(conn, row.id, verdict.children, actions)
    apply_event(conn, row, event, route, item, now, actions, detail=_short(verdict.error), **values)


def apply_event(conn: Connection, row: Row, event: Event, route: Route, item: RouteStep | None, now: datetime,
                actions: Effects, detail: str | None = None, **values: Any) -> None:
    """Write the transition of `event` with the state machine's verdict and note its actions."""
    policy = retry_policy(route, item)
    result = transition(row.state, event, row.failed_count, policy.max_fails)
    values.setdefault("failed_count", result.failed_count)
    if Action.SCHEDULE_RETRY in result.actions and "due_at" not in values:
        values["due_at"] = now + policy.delay(result.failed_count)
    if result.state in (State.OK, State.FAILED, State.CANCEL, State.SKIPPED):
        values.update(due_at=None, finished_at=now, step_run=None)
    if Action.CONFIRM in result.actions:
        if row.source_system in get_registry().confirmers:
            queue_confirmation(conn, row.id, result.state.value, now)
        else:
            log.info("message %s (%s) ended %s; no confirmer for source system %s", row.id, row.correlation_id,
                     result.state.value, row.source_system)
    set_state(conn, row, event.value, result.state, step=item.key if item else None, detail=detail, now=now,
              **values)
    actions.update(result.actions)
    if row.source_system not in get_registry().confirmers:
        actions.discard(Action.CONFIRM)
    if row.funnel is None:
        actions.discard(Action.RELEASE_FUNNEL)
    actions.discard(Action.NOTIFY_PARENT)  # done here, in this transaction, not after commit
    if Action.NOTIFY_PARENT in result.actions and row.parent_id is not None:
        settle_parent(conn, row.parent_id, now, actions)


def _pause(conn: Connection, route_name: str, reason: str, now: datetime) -> None:
    dialect = postgresql if is_postgres(conn) else sqlite
    conn.execute(dialect.insert(route_pauses).values(route=route_name, paused_at=now, reason=reason)
                 .on_conflict_do_nothing(index_elements=["route"]))


def _short(text: str | None) -> str | None:
    if not text:
        return None
    lines = text.strip().splitlines()
    return lines[-1][:500] if lines else None


def after_commit(route: Route, message_id: int, actions: Effects) -> None:
    """Carry out what committed transitions asked for: confirm, dispatch children, release the funnel.

    Each has a backstop if this process dies first: confirmations and re-driven messages are due in
    the store for the poller, children are NEW rows it re-drives.
    """
    work: list[Callable[[], Any]] = []
    if Action.CONFIRM in actions:
        work.append(partial(send_confirmations, message_id))
    if Action.DISPATCH_CHILDREN in actions:
        work.append(partial(dispatch_children, message_id))
    if Action.RELEASE_FUNNEL in actions:
        work.append(partial(release_funnel, message_id))
    for fn in work + getattr(actions, "later", []):
        try:
            fn()
        except Exception:  # noqa: BLE001 - the poller's backstop takes over
            log.exception("message %s: follow-up %s failed; the poller takes over", message_id, fn)


def redispatch(conn: Connection, row: Row, event: Event, now: datetime, start: int = 0) -> tuple[Route, str, int]:
    """Give a message a new fencing token and state IN_QUEUE; publish the returned chain after commit."""
    route = get_registry().route(f"{row.service}.{row.operation}")
    token = str(uuid.uuid4())
    result = transition(row.state, event, row.failed_count)
    set_state(conn, row, event.value, result.state, now=now, attempt_id=token, step_run=None,
              due_at=now + get_settings().lease_grace)
    return route, token, start


def publish_all(chains: list[tuple[Route, int, str, int]]) -> None:
    """Publish chains after their transaction committed (a refused publish is re-driven later)."""
    for route, message_id, token, start in chains:
        dispatch.publish(route, message_id, token, start)
