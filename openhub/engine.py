"""Carrying a message through one step of its route (README.md, "How it works").

A step runs in three parts: `enter` (claim the message or check the chain's fencing token,
take the step lease, consult the step's external-call record), the step itself outside any
transaction, and `record` (write the outcome, if the lease is still ours). Every state change
is written by `lifecycle.apply_event` from the state table, and what it asks for after commit
is carried out by `redrive.carry_out` when the task's steps are done.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from types import SimpleNamespace
from typing import Any, Callable, ContextManager

from sqlalchemy import Connection, Row, and_, bindparam, delete, literal, or_, select, true, update
from sqlalchemy.dialects import postgresql

from . import breaker, limits
from .config import get_settings
from .context import MessageInfo, NoEffect, StepContext, WaitForResponse, aware, error_line
from .db import insert_or_ignore, is_postgres, transaction, utcnow
from .errors import Holdback, Postpone, Reject, StoreUnavailable
from .failures import error_code, is_fatal
from .funnel import funnel_blocked
from .lifecycle import FollowUps, apply_event, redispatch, resume_split
from .model import Route, RouteStep, Split
from .policy import (handover_due, lease_until, outage_pause, postpone_until, retry_policy, step_timeout,
                     verdict_due)
from .redact import redact_text
from .redrive import carry_out
from .registry import get_registry
from .schema import ext_calls, messages, transitions
from .split import prepare_children, write_children
from .states import CallState, Event, Note, State
from .store import (dumps, execute_noted, history_entry, history_where, is_paused, loads, lock_message,
                    paused_routes, update_message)
from .workers import current_id, current_node, fenced, liveness, running

log = logging.getLogger("openhub.engine")
X = ext_calls.c


@dataclass
class Entered:
    """A step that may run: the lease is ours and its context is ready."""

    run_id: str
    key: str
    ctx: StepContext
    row: SimpleNamespace
    started: float = field(default_factory=time.monotonic)
    custom_data: str | None = None  # ctx.custom_data as stored, once the step has run
    call_ok_id: int | None = None  # the record's last success before this run (kept unless this run succeeds)
    call_ok_ts: datetime | None = None


# The state an external-call record takes for each way a step can end (FAILED for the rest): a
# waiting step is OK once its response arrives, and a response timeout makes it FAILED (sent again).
CALL_STATES = {None: CallState.OK, Event.SPLIT: CallState.OK, Event.WAIT_RESPONSE: CallState.WAITING,
               Event.NO_EFFECT: CallState.NO_EFFECT, Event.POSTPONED: CallState.POSTPONED,
               Event.HELD_BACK: CallState.POSTPONED}


@dataclass
class Verdict:
    """How a step ended, as the engine records it."""

    event: Event | None  # None: the step succeeded and the route goes on
    error: str | None = None
    delay: timedelta | None = None
    children: list[Any] = field(default_factory=list)
    code: str | None = None  # the failure's searchable error code (openhub.failures)
    call_state: str = ""  # what the external call did (a CallState); by default what the event implies
    against_system: bool = False  # a transient failure that counts against the step's system's breaker

    def __post_init__(self) -> None:
        self.call_state = self.call_state or CALL_STATES.get(self.event, CallState.FAILED)
        self.error = redact_text(self.error)  # stored, shown and confirmed: never the hub's own credentials


def idempotency_key(row: Row, item: RouteStep) -> str:
    """Stable per message and step (and per total restart), for external systems' own dedup:
    `<source system>/<correlation id>/<step>[/<generation>]`.

    A split child's correlation id is its parent's with `#<generation>.<n>` added, which a source
    system may send as its own id too: so `%`, `#` and `/` in a correlation id are escaped, and a
    child's id is followed by `#<its message id>`. Keys of ids without those characters are unchanged.
    """
    name = _ESCAPES.sub(lambda m: f"%{ord(m.group()):02X}", row.correlation_id)
    if row.parent_id is not None:
        name = f"{name}#{row.id}"
    key = f"{row.source_system}/{name}/{item.key}"
    return f"{key}/{row.generation}" if row.generation else key


_ESCAPES = re.compile(r"[%#/]")


def call_key(row: Row, item: RouteStep, ctx: StepContext) -> str:
    """The external-call record a step is guarded by, by its scope."""
    if item.scope == "entity":
        if row.object_id is None:
            raise Reject(f"step {item.key!r} has entity scope but message {row.id} has no object_id")
        # Per source system: otherwise one system's message dated ahead would make another
        # system's genuine later update of the same entity obsolete (SKIPPED).
        return f"entity:{row.source_system}:{row.entity_type}:{row.object_id}:{item.key}"
    if item.scope == "custom":
        return f"custom:{item.custom_key(ctx)}:{item.key}"  # type: ignore[misc]
    return message_call_key(row.id, item)


def message_call_key(message_id: int, item: RouteStep) -> str:
    """The external-call record of a step with message scope."""
    return f"msg:{message_id}:{item.key}"


def _info(row: Row) -> MessageInfo:
    return MessageInfo(id=row.id, correlation_id=row.correlation_id, source_system=row.source_system,
                       service=row.service, operation=row.operation, object_id=row.object_id,
                       entity_type=row.entity_type, process_id=row.process_id, failed_count=row.failed_count,
                       received_at=aware(row.received_at), msg_timestamp=aware(row.msg_timestamp),
                       parent_id=row.parent_id)


@dataclass(frozen=True)
class StepReport:
    """What one run of a step came to, for the task that ran it (Flower shows it): true when the chain
    should go on."""

    go_on: bool
    outcome: str  # ok, skipped, stopped, or the event the hub recorded (transient, rejected, postponed, ...)
    error: str | None = None

    @property
    def failed(self) -> bool:
        """The step's attempt failed (the hub retries it or has failed the message)."""
        return self.outcome in (Event.TRANSIENT.value, Event.REJECTED.value)

    def __bool__(self) -> bool:
        return self.go_on


# How a step's own time limit is kept where the task's limit covers more than the step (a fused
# task): given the step's timeout in seconds, a context that interrupts the step when it runs over.
TimeLimit = Callable[[float], ContextManager[Any]]


def run_step(route_name: str, index: int, message_id: int, token: str, redelivered: bool = False,
             clock: Callable[[], datetime] = utcnow, limit: TimeLimit | None = None) -> StepReport:
    """Run step `index` of the route for the message; `clock` tells the time (LocalHub moves it)."""
    return run_steps(route_name, index, index + 1, message_id, token, redelivered, clock, limit)[1]


def run_steps(route_name: str, start: int, end: int, message_id: int, token: str, redelivered: bool = False,
              clock: Callable[[], datetime] = utcnow, limit: TimeLimit | None = None) -> tuple[int, StepReport]:
    """Run steps `start`..`end - 1` of the route for the message, one after another in this process
    (a fused task); returns the last step that ran and its report.

    A step that succeeded hands its lease to the next in the transaction that records it: one commit
    between two steps instead of two, with the same claim, fencing token and external-call record.
    """
    route = get_registry().route(route_name)
    follow = FollowUps()
    index, entered, report = start, None, StepReport(True, "skipped")
    try:
        with ExitStack() as runs:  # each run listed in this process's heartbeat until the task ends
            while True:
                if entered is None:
                    run_id = _new_run(runs)
                    with transaction() as conn:
                        entered = _enter(conn, route, index, message_id, token, redelivered, run_id, follow, clock())
                if isinstance(entered, Entered):
                    handed, report = _carry(route, index, end, message_id, token, entered, redelivered, runs,
                                            follow, clock, limit)
                    if handed is not None:
                        index, entered = index + 1, handed
                        continue
                else:  # the step was done before (True), or the chain stops here
                    report = StepReport(bool(entered), "skipped" if entered else "stopped")
                if not report.go_on or index + 1 == end:
                    break
                index, entered = index + 1, None
    finally:  # also when the store went away meanwhile: what committed is carried out
        carry_out(follow, clock())
    return index, report


def _carry(route: Route, index: int, end: int, message_id: int, token: str, entered: Entered, redelivered: bool,
           runs: ExitStack, follow: FollowUps, clock: Callable[[], datetime],
           limit: TimeLimit | None) -> tuple[Entered | bool | None, StepReport]:
    """Run an entered step and write its outcome; returns the next step's entry where it was handed
    over to it (None where not), and the step's report."""
    if fenced(entered.started):  # this process may be judged dead meanwhile: its run is repaired, not carried on
        log.warning("message %s: step %s not run: this process's heartbeat fell behind (stalled, or the store "
                    "unreachable); the run is left to the repair", message_id, route.steps[index].key)
        return None, StepReport(False, "stopped")
    verdict = _outcome(route, index, entered, clock, limit)
    if verdict.event is None and index + 1 < end:
        handed = _hand_over(route, index, message_id, token, entered, verdict, redelivered, _new_run(runs),
                            follow, clock)
        if handed is not None:
            return handed, StepReport(True, "ok")
    recorded, go_on, verdict = record_outcome(route, index, message_id, token, entered, verdict, clock)
    follow.merge(recorded)
    return None, StepReport(go_on, verdict.event.value if verdict.event else "ok", _short(verdict.error))


def _new_run(runs: ExitStack) -> str:
    return runs.enter_context(running())  # listed before its lease is taken


def _outcome(route: Route, index: int, entered: Entered, clock: Callable[[], datetime],
             limit: TimeLimit | None) -> Verdict:
    """Run the step (outside any transaction) and tell how it ended."""
    item = route.steps[index]
    verdict = _run(route, item, entered.ctx, limit)
    if verdict.event is Event.SPLIT:
        try:
            verdict.children = prepare_children(entered.row, item, verdict.children, clock())
        except Reject as exc:
            verdict = Verdict(Event.REJECTED, error=f"Reject: {exc.reason}", code="SPLIT")
    try:
        entered.custom_data = dumps(entered.ctx.custom_data)
    except (TypeError, ValueError) as exc:  # kept as it was; the call itself is recorded for what it did
        verdict = Verdict(Event.REJECTED, call_state=_effect(verdict), code="CUSTOM_DATA",
                          error=f"step {item.key!r} left custom_data that is not JSON-serialisable: {exc}")
    return verdict


def _hand_over(route: Route, index: int, message_id: int, token: str, entered: Entered, verdict: Verdict,
               redelivered: bool, next_run: str, follow: FollowUps,
               clock: Callable[[], datetime]) -> Entered | bool | None:
    """Record step `index`'s success and enter the next step in one transaction (a fused task).

    A store that is away is waited for, as `record_outcome` does. None when it could not be done
    for another reason (a bug, Celery's time limit): the caller then records the step alone, so the
    step's success is never mislabelled by a fault of the step after it.
    """
    attempt = 0
    while True:
        handed = FollowUps()
        try:
            with transaction() as conn:
                entered_next = _record_and_enter(conn, route, index, message_id, token, entered, verdict,
                                                 redelivered, next_run, handed, clock())
            follow.merge(handed)
            return entered_next
        except StoreUnavailable as exc:
            attempt += 1
            log.warning("message %s: handing step %s over failed (%s); trying again", message_id,
                        route.steps[index].key, exc)
            _pause_before_retry(outage_pause(attempt))
        except Exception as exc:  # noqa: BLE001 - recorded alone instead
            if not _is_interruption(exc):
                log.exception("message %s: handing step %s over to the next failed; recording it alone",
                              message_id, route.steps[index].key)
            return None


def _record_and_enter(conn: Connection, route: Route, index: int, message_id: int, token: str, entered: Entered,
                      verdict: Verdict, redelivered: bool, next_run: str, follow: FollowUps,
                      now: datetime) -> Entered | bool:
    item = route.steps[index]
    row = entered.row
    errors = loads(row.business_errors, []) + entered.ctx.business_errors
    lease = _lease(route.steps[index + 1], next_run, now)
    # The compare-and-set of `_record`, taking the next step's lease in the same statement.
    taken, call_taken = _write_outcome(conn, message_id, token, entered, verdict, item, dict(
        lease, custom_data=entered.custom_data if entered.custom_data is not None else row.custom_data,
        business_errors=dumps(errors) if errors else None), now, route.steps[index + 1])
    if taken is None:  # the lease was lost: discard the outcome as `_record` does
        return _record(conn, route, index, message_id, token, entered, verdict, follow, now)
    return _prepare(conn, route, index + 1, taken, next_run, redelivered, follow, now, call_taken)


def record_outcome(route: Route, index: int, message_id: int, token: str, entered: Entered,
                   verdict: Verdict, clock: Callable[[], datetime] = utcnow) -> tuple[FollowUps, bool, Verdict]:
    """Write a step's outcome; never give up while this process lives, or a repair would call again.

    The lease stays ours meanwhile: the heartbeat tells the poller this process is alive. A store
    that is away is waited for; a write that fails for any other reason (a bug, a follow-up that
    cannot be carried out) is replaced by a transient failure that still records what the call did.
    """
    item = route.steps[index]
    attempt = 0
    while True:
        recorded = FollowUps()
        try:
            try:
                with transaction() as conn:
                    go_on = _record(conn, route, index, message_id, token, entered, verdict, recorded, clock())
                return recorded, go_on, verdict
            except StoreUnavailable as exc:
                attempt += 1
                log.warning("message %s: recording step %s failed (%s); trying again", message_id, item.key, exc)
                _pause_before_retry(outage_pause(attempt))
        except Exception as exc:  # noqa: BLE001 - see below
            if _is_interruption(exc):
                continue  # Celery's soft time limit arrived while recording: the step itself is done
            if verdict.event is Event.TRANSIENT and verdict.error and verdict.error.startswith(_UNRECORDED):
                raise  # the fallback failed too: the lease repair takes over
            log.exception("message %s: recording step %s failed; recorded as a transient failure",
                          message_id, item.key)
            verdict = Verdict(Event.TRANSIENT, call_state=_effect(verdict), code="UNRECORDED",
                              error=f"{_UNRECORDED} {item.key!r}:\n{traceback.format_exc()}")


_UNRECORDED = "could not record the outcome of step"


def _effect(verdict: Verdict) -> str:
    """What the step's external call did, to keep on its record when the verdict itself is not written.

    A split calls nothing: its effect is its children, written with its verdict. Where that verdict
    is discarded (the lease was lost, the write failed), the split did nothing, and a later run must
    split again rather than find it done with no children.
    """
    return CallState.FAILED if verdict.event is Event.SPLIT else verdict.call_state


def _pause_before_retry(seconds: float) -> None:
    time.sleep(seconds)  # back off from an outage or a conflict; the step's outcome waits in memory


def _is_interruption(exc: BaseException) -> bool:
    # Celery's SoftTimeLimitExceeded, named rather than imported: the engine does not import Celery.
    return type(exc).__name__ == "SoftTimeLimitExceeded"


def _enter(conn: Connection, route: Route, index: int, message_id: int, token: str, redelivered: bool,
           run_id: str, follow: FollowUps, now: datetime) -> Entered | bool:
    item = route.steps[index]
    lease = _lease(item, run_id, now)
    # The route's first step finds its message NEW or IN_QUEUE, to be claimed: the lease would not take it.
    row, call_taken = (None, False) if index == 0 else _take_lease(conn, item, message_id, token, now, lease)
    if row is None:  # not a chain going on to its next step: find out why, under the row lock
        row = lock_message(conn, message_id)
        if row is None or row.attempt_id != token:
            log.info("message %s: stale chain (token changed), stopping without effect", message_id)
            return False
        if index == 0 and row.state == State.PROCESSING:  # the first task delivered again: as any step's
            row, call_taken = _take_lease(conn, item, message_id, token, now, lease)
            if row is None:
                log.info("message %s is PROCESSING and another run holds the step lease: this chain stops",
                         message_id)
                return False
        elif row.state not in (State.NEW, State.IN_QUEUE):
            log.info("message %s is %s%s: this chain stops", message_id, row.state,
                     " and another run holds the step lease" if row.state == State.PROCESSING else "")
            return False
        else:
            if not _claim(conn, row, route, item, now, lease, follow):
                return False
            row = _with(row, state=State.PROCESSING.value, attempts=row.attempts + 1,
                        started_at=row.started_at or now, blocked_since=None, **lease)
    return _prepare(conn, route, index, row, run_id, redelivered, follow, now, call_taken)


def _lease(item: RouteStep, run_id: str, now: datetime) -> dict[str, Any]:
    """The columns of a step lease held by this process's run `run_id`."""
    return dict(step_run=run_id, worker=current_id(), due_at=lease_until(item, now, get_settings()),
                updated_at=now)


def _prepare(conn: Connection, route: Route, index: int, row: Any, run_id: str, redelivered: bool,
             follow: FollowUps, now: datetime, call_taken: bool = False) -> Entered | bool:
    """With the step lease ours: the step's context and its external-call record (or why it does not run);
    `call_taken`: the statement that took the lease inserted the step's first call record."""
    item = route.steps[index]
    message_id = row.id
    custom_data = loads(row.custom_data, {})
    ctx = StepContext(payload=loads(row.payload), message=_info(row), idempotency_key=idempotency_key(row, item),
                      attempt=1, redelivered=redelivered, custom_data=custom_data, response=loads(row.response))
    try:
        key = call_key(row, item, ctx)
    except Exception as exc:  # a custom key that cannot be computed is the message's fault
        _finish(conn, row, route, item, Verdict(Event.REJECTED, error=f"{exc}", code="CUSTOM_KEY"), now, follow)
        return False
    system = getattr(item, "system", None)
    until = breaker.closed_until(conn, system, now) if system else None
    if until is not None:  # its system is failing: wait for the breaker, no failure counted
        apply_event(conn, row, Event.POSTPONED, route, item, now, follow, step_run=None, worker=None,
                    detail=f"{system} is unavailable: its circuit breaker is open", due_at=until)
        return False
    call = None if call_taken else _take_call(conn, key, row, item, now)
    if call is not None and call.ok_message_id == row.id:  # this message's call already succeeded
        if isinstance(item, Split) and not resume_split(conn, row, item, now, follow):
            return False
        log.debug("message %s: step %s already OK, skipped", message_id, item.key)
        if index == len(route.steps) - 1:
            _finish(conn, row, route, item, Verdict(Event.COMPLETED), now, follow)
            return False
        update_message(conn, row.id, step_run=None, worker=None, due_at=handover_due(now, get_settings()),
                       updated_at=now)
        return True
    if call is not None and call.ok_message_id is not None and \
            (call.ok_msg_timestamp, call.ok_message_id) > (row.msg_timestamp, row.id):
        apply_event(conn, row, Event.OBSOLETE, route, item, now, follow, due_at=None, finished_at=now,
                    detail=f"newer message {call.ok_message_id} already did {key}")
        return False
    if call is not None and call.state == CallState.PROCESSING and call.message_id != row.id:
        holder = _in_flight(conn, call.message_id, now)
        if holder:  # two versions of one entity must not call the system at once; the older would win
            apply_event(conn, row, Event.POSTPONED, route, item, now, follow, step_run=None, worker=None,
                        detail=f"{key} is being called by message {call.message_id}",
                        due_at=postpone_until(now, get_settings()))
            return False
    busy = _system_busy(system, run_id, row.due_at, conn, now) if system else None
    if busy is not None:  # the system takes no more calls now: wait, no failure counted
        if call is None:  # its record was made by this entry, and no call happened
            conn.execute(delete(ext_calls).where(X.key == key))
        until, why = busy
        apply_event(conn, row, Event.POSTPONED, route, item, now, follow, step_run=None, worker=None,
                    detail=why, due_at=until)
        return False
    if call is not None:
        ctx.attempt = call.attempts + 1 if call.message_id == row.id else 1
        conn.execute(update(ext_calls).where(X.key == key).values(
            state=CallState.PROCESSING.value, message_id=row.id, msg_timestamp=row.msg_timestamp, updated_at=now,
            attempts=ctx.attempt, worker=current_node()))
    return Entered(run_id=run_id, key=key, ctx=ctx, row=_with(row), call_ok_id=call.ok_message_id if call else None,
                   call_ok_ts=call.ok_msg_timestamp if call else None)


def _system_busy(system: str, run_id: str, lease_until: datetime, conn: Connection,
                 now: datetime) -> tuple[datetime, str] | None:
    """Until when, and why, a step may not call its system now: its rate or its calls in flight."""
    settings = get_settings()
    rate = settings.system_rates.get(system)
    until = limits.paced(conn, system, rate, now) if rate else None
    if until is not None:
        return until, f"{system} is at its rate of {rate[0]} calls per {rate[1]:g} s (OPENHUB_SYSTEM_RATES)"
    limit = settings.system_limits.get(system)
    if limit and not limits.take(conn, system, limit, run_id, lease_until, now):
        return postpone_until(now, settings), f"{system} has its {limit} calls in flight (OPENHUB_SYSTEM_LIMITS)"
    return None


def _in_flight(conn: Connection, message_id: int, now: datetime) -> bool:
    """Whether a step of the message is running now (its worker's heartbeat lists the run).

    A cancelled message keeps its run until the run ends, so this holds in any state.
    """
    other = conn.execute(select(messages.c.step_run, messages.c.worker, messages.c.due_at, messages.c.updated_at)
                         .where(messages.c.id == message_id)).first()
    if other is None or other.step_run is None:
        return False
    known = liveness(conn).run_in_flight(other.worker, other.step_run, other.updated_at)
    if known is not None:
        return known
    return other.due_at is not None and other.due_at > now  # a worker without heartbeat: its lease


_LEASE = (update(messages).where(and_(
    messages.c.id == bindparam("mid"), messages.c.attempt_id == bindparam("token"),
    messages.c.state == State.PROCESSING.value,
    or_(messages.c.step_run.is_(None), messages.c.due_at < bindparam("now"))))
    .values(step_run=bindparam("run"), worker=bindparam("holder"), due_at=bindparam("lease_until"),
            updated_at=bindparam("now"))
    .returning(*messages.c))


def _first_call(source: Any) -> Any:
    # PostgreSQL: the step's first call record (message scope) of the message row the data-modifying CTE
    # `source` returns, inserted where there is none; the statement returns that row and `new_call`, the
    # record's id (None: it was there, or the row was not written).
    new = (postgresql.insert(ext_calls).from_select(
        ["key", "message_id", "step_key", "scope", "state", "msg_timestamp", "attempts", "created_at", "updated_at",
         "worker"],
        select(bindparam("n_key", type_=X.key.type), source.c.id, bindparam("n_step_key", type_=X.step_key.type),
               literal("message"), literal(CallState.PROCESSING.value), source.c.msg_timestamp, literal(1),
               bindparam("n_now", type_=X.created_at.type), bindparam("n_now", type_=X.created_at.type),
               bindparam("n_node", type_=X.worker.type)))
           .on_conflict_do_nothing(index_elements=["key"]).returning(X.id).cte("new_call"))
    return select(source, new.c.id.label("new_call")).select_from(source.outerjoin(new, true()))


def _folds_call(conn: Connection, item: RouteStep) -> bool:
    """Whether the statement that takes the step's lease also inserts its first call record: on
    PostgreSQL, for a step with message scope and no system (whose circuit breaker and limits are
    consulted before a record is made)."""
    return item.scope == "message" and getattr(item, "system", None) is None and is_postgres(conn)


def _first_call_params(message_id: int, item: RouteStep, now: datetime) -> dict[str, Any]:
    return {"n_key": message_call_key(message_id, item), "n_step_key": item.key, "n_now": now,
            "n_node": current_node()}


def _with_first_call(row: Row | None) -> tuple[Any, bool]:
    """The message row of a `_first_call` statement, and whether the call record was inserted."""
    if row is None:
        return None, False
    values = dict(row._mapping)
    inserted = values.pop("new_call") is not None
    return SimpleNamespace(**values), inserted


_LEASE_AND_CALL = _first_call(_LEASE.cte("lease"))


def _take_lease(conn: Connection, item: RouteStep, message_id: int, token: str, now: datetime,
                lease: dict[str, Any]) -> tuple[Any, bool]:
    """The common case in one statement: the chain carrying the message takes the next step's lease.

    On PostgreSQL, a step with message scope and no system (whose breaker and limits are consulted
    before a call record is made) gets its first call record in the same statement: the row, and
    whether that record was inserted.
    """
    params = {"mid": message_id, "token": token, "now": now, "run": lease["step_run"], "holder": lease["worker"],
              "lease_until": lease["due_at"]}
    if not _folds_call(conn, item):
        return conn.execute(_LEASE, params).first(), False
    return _with_first_call(conn.execute(_LEASE_AND_CALL, {**params, **_first_call_params(message_id, item, now)})
                            .first())


def _claim(conn: Connection, row: Row, route: Route, item: RouteStep, now: datetime, lease: dict[str, Any],
           follow: FollowUps) -> bool:
    """The chain's first task takes a NEW/IN_QUEUE message, unless its route is paused, its funnel busy,
    or a run of an earlier chain (cancelled, then restarted) is still calling out."""
    settings = get_settings()
    if row.expires_at is not None and row.expires_at <= now:
        expired = f"expired at {row.expires_at.isoformat()}Z before it was carried out"
        apply_event(conn, row, Event.EXPIRED, route, item, now, follow, detail=expired, error_code="EXPIRED",
                    failed_error=expired)
        return False
    if row.step_run is not None and _in_flight(conn, row.id, now):
        apply_event(conn, row, Event.POSTPONED, route, item, now, follow, due_at=postpone_until(now, settings),
                    detail="an earlier run of the message is still in flight")
        return False
    paused = paused_routes(conn)
    if is_paused(paused, route.name):
        apply_event(conn, row, Event.POSTPONED, route, item, now, follow,
                    detail="route paused" if route.name in paused else "the hub is draining",
                    due_at=postpone_until(now, settings))
        return False
    blocked = funnel_blocked(conn, row, route)
    if blocked:
        # The order timeout counts from when the message first found its funnel blocked, not from
        # when it arrived: time spent paused or waiting for a retry is not time blocked.
        since = row.blocked_since or now
        if route.order_timeout and since < now - route.order_timeout:
            apply_event(conn, row, Event.ORDER_EXPIRED, route, item, now, follow, detail=blocked,
                        error_code="ORDER_TIMEOUT",
                        failed_error=f"blocked in funnel {row.funnel!r} longer than {route.order_timeout}: {blocked}")
            return False
        apply_event(conn, row, Event.POSTPONED, route, item, now, follow, detail=blocked, blocked_since=since,
                    due_at=postpone_until(now, settings))
        return False
    # A retry's chain starts at the route's first step and skips those already OK: the history names
    # the step the attempt resumes at, as its call records tell (a first attempt has none to read).
    resumes = _first_step_not_done(conn, row, route, item) if row.attempts else item
    apply_event(conn, row, Event.CLAIMED, route, resumes, now, follow, attempts=row.attempts + 1,
                started_at=row.started_at or now, blocked_since=None, **lease)
    return True


def _first_step_not_done(conn: Connection, row: Row, route: Route, item: RouteStep) -> RouteStep:
    """From `item` on, the first step of the route whose call this message has not made successfully."""
    done = set(conn.execute(select(ext_calls.c.step_key).where(
        ext_calls.c.message_id == row.id, ext_calls.c.ok_message_id == row.id)).scalars())
    later = route.steps[route.steps.index(item):]
    return next((step for step in later if step.key not in done), item)


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
        "key": key, "message_id": row.id, "step_key": item.key, "scope": item.scope,
        "state": CallState.PROCESSING.value, "msg_timestamp": row.msg_timestamp, "attempts": 1,
        "created_at": now, "updated_at": now, "worker": current_node()}).first()
    if inserted is not None:
        return None
    return conn.execute(_LOCK_CALL[pg], {"call_key": key}).one()


_NEW_CALL = {pg: insert_or_ignore(ext_calls, pg, index_elements=["key"]).returning(X.id) for pg in (False, True)}
_LOCK_CALL = {False: select(ext_calls).where(X.key == bindparam("call_key")),
              True: select(ext_calls).where(X.key == bindparam("call_key")).with_for_update()}


def _run(route: Route, item: RouteStep, ctx: StepContext, limit: TimeLimit | None = None) -> Verdict:
    try:
        with limit(step_timeout(item, get_settings()).total_seconds()) if limit else nullcontext():
            result = item.fn(ctx)
        if isinstance(item, Split):
            return Verdict(Event.SPLIT, children=list(result or []))
        return Verdict(None)
    except WaitForResponse as exc:
        return Verdict(Event.WAIT_RESPONSE, delay=exc.timeout)
    except NoEffect:
        return Verdict(Event.NO_EFFECT, error="no effect", code="NO_EFFECT")
    except Postpone as exc:
        return Verdict(Event.POSTPONED, delay=exc.delay, error=exc.reason)
    except Holdback as exc:
        return Verdict(Event.HELD_BACK, error=exc.reason)
    except Exception as exc:  # fatal by class (Reject, fatal=, validation, HTTP 4xx), else transient: a fault to retry
        code = error_code(exc)
        if not is_fatal(exc, route.fatal + item.fatal):
            return Verdict(Event.TRANSIENT, error=traceback.format_exc(), code=code,
                           against_system=breaker.counts_against_system(exc))
        if isinstance(exc, Reject):
            return Verdict(Event.REJECTED, error=f"Reject: {exc.reason}" + (f" [{exc.code}]" if exc.code else ""),
                           code=code)
        return Verdict(Event.REJECTED, error=traceback.format_exc(), code=code)


def _record(conn: Connection, route: Route, index: int, message_id: int, token: str, entered: Entered,
            verdict: Verdict, follow: FollowUps, now: datetime) -> bool:
    item = route.steps[index]
    ctx = entered.ctx
    row = entered.row  # still accurate: the step lease kept everyone else off the message
    duration = int((time.monotonic() - entered.started) * 1000)
    succeeded = verdict.event in (None, Event.SPLIT, Event.WAIT_RESPONSE)
    # A failed attempt's business errors are not kept: the retry reports them again if they still hold.
    errors = loads(row.business_errors, []) + (ctx.business_errors if succeeded else [])
    common = dict(custom_data=entered.custom_data if entered.custom_data is not None else row.custom_data,
                  business_errors=dumps(errors) if errors else None, step_run=None, worker=None, updated_at=now)
    last = index == len(route.steps) - 1
    if verdict.event is None and not last:
        common["due_at"] = handover_due(now, get_settings())  # the next step's task must arrive by then
        # This worker publishes that task: named here, its death re-publishes the chain at once.
        common["worker"] = current_id()
    kept, _ = _write_outcome(conn, message_id, token, entered, verdict, item, common, now)
    if kept is None:
        log.warning("message %s: step %s finished after its lease was lost; outcome discarded", message_id, item.key)
        system = getattr(item, "system", None)
        if system in get_settings().system_limits:
            limits.release(conn, system, entered.run_id)
        if _effect(verdict) == CallState.OK:  # the call did succeed: a later run must not make it again
            conn.execute(_CALL_DONE.where(X.state == CallState.PROCESSING.value),
                         _call_done(entered, row, CallState.OK, now, duration))
        # A cancelled message kept this run as in flight: it has ended now, and the funnel may go on.
        released = conn.execute(update(messages).where(and_(messages.c.id == message_id,
                                                            messages.c.step_run == entered.run_id))
                                .values(step_run=None, worker=None).returning(messages.c.funnel)).first()
        if released is not None and released.funnel is not None:
            follow.funnels.append(message_id)
        return False
    if verdict.event is None and not last:
        return True
    answered_meanwhile = verdict.event is Event.WAIT_RESPONSE and (
        kept.response != row.response or _answered_early(conn, row.id))
    row = _with(row, **common)
    _finish(conn, row, route, item, verdict if verdict.event else Verdict(Event.COMPLETED), now, follow)
    if answered_meanwhile:  # the response came while the step ran: no need to wait for it
        conn.execute(_CALL_DONE, _call_done(entered, row, CallState.OK, now, duration))
        redispatch(conn, _with(row, state=State.WAITING_FOR_RES.value), Event.RESPONDED, now, follow)
    return False


def _write_outcome(conn: Connection, message_id: int, token: str, entered: Entered, verdict: Verdict,
                   item: RouteStep, values: dict[str, Any], now: datetime,
                   next_item: RouteStep | None = None) -> tuple[Any, bool]:
    """The compare-and-set of a step's outcome, writing `values` to the message: it counts only if the
    lease is still ours (no cancel, no repair). Where it held, what the step's external call did is
    written to its record, and a succeeded step to the history; with `next_item`, whose lease `values`
    take, the next step's first call record may be inserted too. Returns the row written (None, with
    nothing written, where the lease was lost), all of it with `next_item` (else its id and response),
    and whether that record was. On PostgreSQL all of it is one statement."""
    keep = _HAND_OVER if next_item is not None else _KEEP
    done, entry = _closing(entered, verdict, item, now)
    cas = {"mid": message_id, "token": token, "run": entered.run_id}
    if is_postgres(conn):
        fold = next_item is not None and _folds_call(conn, next_item)
        params = {**cas, **{f"m_{c}": v for c, v in values.items()}, **done, **(entry or {})}
        if fold:
            assert next_item is not None
            params.update(_first_call_params(message_id, next_item, now))
        statement = _outcome_statement(keep, tuple(sorted(values)), entry is not None, fold)
        kept, call_taken = _with_first_call(conn.execute(statement, params).first())
    else:
        kept, call_taken = conn.execute(keep, {**cas, **values}).first(), False
        if kept is not None and entry is not None:
            execute_noted(conn, _CALL_DONE, done, entry)
        elif kept is not None:
            conn.execute(_CALL_DONE, done)
    if kept is not None:
        _call_effects(conn, entered, verdict, item, now)
    return kept, call_taken


@cache
def _outcome_statement(cas: Any, columns: tuple[str, ...], noted: bool, first_call: bool) -> Any:
    # The compare-and-set `cas` setting `columns` (as parameters m_<column>), with _CALL_DONE (and,
    # `noted`, the step_ok entry; `first_call`, the next step's first call record) as data-modifying
    # CTEs that write only where it held. Built once per shape.
    keep = cas.values({c: bindparam(f"m_{c}") for c in columns}).cte("keep")
    held = select(keep.c.id).exists()
    ctes = [_CALL_DONE.where(held).cte("call_done")] + ([history_where(held).cte("history")] if noted else [])
    if first_call:
        return _first_call(keep).add_cte(*ctes)
    return select(keep, literal(None).label("new_call")).add_cte(*ctes)


def _closing(entered: Entered, verdict: Verdict, item: RouteStep,
             now: datetime) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The parameters of _CALL_DONE for a step's outcome, and of its step_ok entry where it succeeded."""
    row = entered.row
    duration = int((time.monotonic() - entered.started) * 1000)
    error = verdict.error[-4000:] if verdict.error and verdict.call_state == CallState.FAILED else None
    done = _call_done(entered, row, verdict.call_state, now, duration, error)
    if verdict.call_state not in (CallState.OK, CallState.WAITING):
        return done, None
    return done, history_entry(row.id, Note.STEP_OK.value, row.state, row.state, step=item.key, now=now)


def _call_effects(conn: Connection, entered: Entered, verdict: Verdict, item: RouteStep, now: datetime) -> None:
    """What a step's call tells its system's limits and circuit breaker."""
    system = getattr(item, "system", None)
    if system in get_settings().system_limits:
        limits.release(conn, system, entered.run_id)
    if system and verdict.event is Event.TRANSIENT and verdict.against_system:
        breaker.failed(conn, system, now)
    elif system and verdict.call_state in (CallState.OK, CallState.WAITING):
        breaker.succeeded(conn, system)


def _answered_early(conn: Connection, message_id: int) -> bool:
    """Whether a response came while an earlier step ran and no wait has taken it since.

    `openhub.respond` keeps such a response (history event response_early); the wait it was meant
    for is the next one, so that wait must not park.
    """
    last = conn.execute(select(transitions.c.event).where(and_(
        transitions.c.message_id == message_id,
        transitions.c.event.in_((Note.RESPONSE_EARLY.value, Event.WAIT_RESPONSE.value, Event.RESPONDED.value))))
        .order_by(transitions.c.id.desc()).limit(1)).scalar()
    return last == Note.RESPONSE_EARLY


# Compare-and-set of a step's outcome: written only while the step's lease is still this run's.
_KEEP = (update(messages).where(and_(
    messages.c.id == bindparam("mid"), messages.c.attempt_id == bindparam("token"),
    messages.c.step_run == bindparam("run"), messages.c.state == State.PROCESSING.value))
    .returning(messages.c.id, messages.c.response))
# The same, handing the lease to the next step's run (a fused task): the updated row is returned.
_HAND_OVER = (update(messages).where(_KEEP.whereclause).returning(*messages.c))
# Its parameters are named after no column: in a statement with data-modifying CTEs SQLAlchemy would
# take a parameter named after a column for one more SET column of every table the statement updates.
_CALL_DONE = (update(ext_calls).where(and_(X.key == bindparam("c_key"), X.message_id == bindparam("mid")))
              .values(state=bindparam("c_state"), updated_at=bindparam("c_at"), duration_ms=bindparam("c_ms"),
                      last_error=bindparam("c_error"), ok_message_id=bindparam("c_ok_id"),
                      ok_msg_timestamp=bindparam("c_ok_ts")))


def _call_done(entered: Entered, row: Any, state: str, now: datetime, duration: int,
               error: str | None = None) -> dict[str, Any]:
    """Parameters of _CALL_DONE: a call that succeeded names this message as its last success."""
    ok = state == CallState.OK
    return {"c_key": entered.key, "mid": row.id, "c_state": str(state), "c_at": now, "c_ms": duration,
            "c_error": error, "c_ok_id": row.id if ok else entered.call_ok_id,
            "c_ok_ts": row.msg_timestamp if ok else entered.call_ok_ts}


def _finish(conn: Connection, row: Row, route: Route, item: RouteStep, verdict: Verdict, now: datetime,
            follow: FollowUps, **values: Any) -> None:
    """Apply a verdict that ends this chain: final state, retry, postpone, wait or split."""
    settings = get_settings()
    event = verdict.event
    assert event is not None
    values.update(step_run=None, worker=None)
    if event in (Event.TRANSIENT, Event.REJECTED, Event.NO_EFFECT):
        values.update(failed_step=item.key, failed_error=verdict.error, error_code=verdict.code)
    if event in (Event.POSTPONED, Event.HELD_BACK, Event.WAIT_RESPONSE, Event.NO_EFFECT):
        values["due_at"] = verdict_due(event, verdict.delay, retry_policy(route, item, settings), now, settings)
    elif event is Event.SPLIT:
        values["due_at"] = None
        assert isinstance(item, Split)
        write_children(conn, row.id, item, verdict.children)
    apply_event(conn, row, event, route, item, now, follow, detail=_short(verdict.error), **values)


def _short(text: str | None) -> str | None:
    return error_line(text)
