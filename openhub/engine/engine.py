"""Carrying a message through one step of its route (README.md, "How it works").

A step runs in three parts: `entry.enter` (claim the message or check the chain's fencing token,
take the step lease, consult the step's external-call record), the step itself outside any
transaction (here), and `recording.record` (write the outcome, if the lease is still ours). Every state change
is written by `lifecycle.apply_event` from the state table, and what it asks for after commit
is carried out by `followups.carry_out` when the task's steps are done.

What this module decides is the order of those parts. Whether a step may go on is asked of
openhub.engine.admission, the lease and call-record columns are written by openhub.engine.leases, and what a
run came to is an openhub.core.verdicts value; a step run travels as one `runs.StepRun`.
"""

from __future__ import annotations

import logging
import time
import traceback
from contextlib import ExitStack, nullcontext
from functools import partial
from typing import Any, Callable, TypeVar

from openhub.core import codes
from openhub.core.context import NoEffect, StepContext, WaitForResponse, error_line
from openhub.core.declared import is_declared
from openhub.core.errors import Fenced, Holdback, Interrupted, Postpone, Reject, StoreUnavailable
from openhub.core.failures import error_code, is_fatal
from openhub.core.model import Split
from openhub.core.policy import outage_pause, postpone_until, step_timeout
from openhub.core.redact import secrets_scope
from openhub.core.runs import Entered, StepRun, TimeLimit
from openhub.core.secret_fields import secret_values
from openhub.core.states import Event, State
from openhub.core.tracing import step_span
from openhub.core.verdicts import StepReport, Verdict
from openhub.engine import admission, entry, leases
from openhub.engine.followups import carry_out
from openhub.engine.hub import Hub, given
from openhub.engine.lifecycle import FollowUps, Tx, apply_event
from openhub.engine.recording import fits_alone, record, record_alone
from openhub.engine.split import prepare_children
from openhub.outbound.breaker import counts_against_system
from openhub.store.queries import dumps, loads, lock_message
from openhub.store.workers import fenced, fencing, running

__all__ = ["StepReport", "TimeLimit", "Verdict", "run_step", "run_steps"]

log = logging.getLogger("openhub.engine")
T = TypeVar("T")


def run_step(
    route_name: str,
    index: int,
    message_id: int,
    token: str,
    redelivered: bool = False,
    hub: Hub | None = None,
    limit: TimeLimit | None = None,
    *,
    translate: Callable[[BaseException], BaseException] | None = None,
) -> StepReport:
    """Run step `index` of the route for the message in `hub` (default: the process's)."""
    return run_steps(route_name, index, index + 1, message_id, token, redelivered, hub, limit, translate=translate)[1]


def run_steps(
    route_name: str,
    start: int,
    end: int,
    message_id: int,
    token: str,
    redelivered: bool = False,
    hub: Hub | None = None,
    limit: TimeLimit | None = None,
    *,
    translate: Callable[[BaseException], BaseException] | None = None,
) -> tuple[int, StepReport]:
    """Run steps `start`..`end - 1` of the route for the message, one after another in this process
    (a fused task); returns the last step that ran and its report. `translate` reads the driver's own
    exceptions as openhub's (tasks/: Celery's soft time limit is an `Interrupted`).

    A step that succeeded hands its lease to the next in the transaction that records it: one commit
    between two steps instead of two, with the same claim, fencing token and external-call record.
    """
    hub = given(hub)  # the driver's hub: its routes, settings and clock (LocalHub moves the clock)
    hub.refresh()  # an admin's live settings (openhub.core.live), read at most every half poll interval
    options = {} if translate is None else {"translate": translate}
    return _carry_through(
        StepRun(hub.registry.route(route_name), start, message_id, token, hub, redelivered, limit, **options), end
    )


def _carry_through(run: StepRun, end: int) -> tuple[int, StepReport]:
    follow = FollowUps()
    entered: Entered | bool | None = None
    report = StepReport(True, "skipped")
    try:
        with ExitStack() as runs:  # each run listed in this process's heartbeat until the task ends
            while True:
                if entered is None:
                    run_id = new_run(runs)
                    entered = entry.enter_alone(run, run_id, follow)  # one round trip, where it can
                    if entered is None:
                        with run.hub.transaction() as conn:
                            entered = entry.enter(Tx(conn, run.clock(), follow, run.hub), run, run_id)
                if isinstance(entered, Entered):
                    handed, report = _carry(run, end, entered, runs, follow)
                    if handed is not None:
                        run, entered = run.next(), handed
                        continue
                else:  # the step was done before (True), or the chain stops here
                    report = StepReport(bool(entered), "skipped" if entered else "stopped")
                if not report.go_on or run.index + 1 == end:
                    break
                run, entered = run.next(), None
    finally:  # also when the store went away meanwhile: what committed is carried out
        carry_out(run.hub, follow, run.clock())
    return run.index, report


def _carry(
    run: StepRun, end: int, entered: Entered, runs: ExitStack, follow: FollowUps
) -> tuple[Entered | bool | None, StepReport]:
    """Run an entered step and write its outcome; returns the next step's entry where it was handed
    over to it (None where not), and the step's report."""
    if left_to_repair(run, entered):
        return None, StepReport(False, "stopped")
    try:
        verdict = outcome(run, entered)
    except Fenced:
        fenced_in_call(run, entered)
        return None, StepReport(False, "stopped")
    if verdict.event is None and run.index + 1 < end:
        handed = _hand_over(run, entered, verdict, new_run(runs), follow)
        if handed is not None:
            return handed, StepReport(True, "ok")
    if _recorded_alone(run, entered, verdict):
        return None, StepReport.of(verdict, not run.last)
    recorded, go_on, verdict = _record_outcome(run, entered, verdict)
    follow.merge(recorded)
    return None, StepReport.of(verdict, go_on)


def left_to_repair(run: StepRun, entered: Entered) -> bool:
    """Whether the entered step must not run: this process may have been judged dead since its lease was
    taken (openhub.store.workers.fenced). The run is not carried on: its lease is let go (`drop_fenced`), or,
    where the store cannot be reached, left to the repair."""
    if not fenced(entered.started):
        return False
    log.warning(
        "message %s: step %s not run: this process's heartbeat fell behind (stalled, or the store "
        "unreachable); its lease is let go",
        run.message_id,
        run.item.key,
    )
    drop_fenced(run, entered, step_ran=False)
    return True


def fenced_in_call(run: StepRun, entered: Entered) -> None:
    """The step's external call was refused by the fence (openhub.store.workers.check_fence): as `left_to_repair`."""
    log.warning(
        "message %s: step %s's call not made: this process's heartbeat fell behind (stalled, or the "
        "store unreachable); its lease is let go",
        run.message_id,
        run.item.key,
    )
    drop_fenced(run, entered, step_ran=True)


def drop_fenced(run: StepRun, entered: Entered, *, step_ran: bool) -> None:
    """Let go of the lease of a run the fence stopped before its call, where it is still this run's (a
    compare-and-set: no repair took it meanwhile). Nothing is counted, neither a failure nor a lost run:
    it is the hub's own fault, and no call was made. The poller re-drives the message after
    OPENHUB_POSTPONE_INTERVAL, as a postponed one (at once, this process might take it back while still
    fenced). Where the store cannot be reached, the lease repair lets it go instead, as a run lost.

    Where the step did not run at all (`step_ran` false) its call record goes back to what the run found
    (`leases.call_not_made`): the next run is the same attempt, not redelivered. Where it ran up to a call
    the fence refused, the record stays as begun: what the step did before that call is not known here."""
    follow = FollowUps()
    try:
        with run.hub.transaction() as conn:
            tx = Tx(conn, run.clock(), follow, run.hub)
            row = lock_message(conn, run.message_id)
            if row is None or (row.attempt_id, row.step_run, row.state) != (
                run.token,
                entered.run_id,
                State.PROCESSING.value,
            ):
                return
            apply_event(
                tx,
                row,
                Event.LEASE_DROPPED,
                run.route,
                run.item,
                **leases.dropped(),
                due_at=postpone_until(tx.now, run.hub.settings),
                detail=f"FENCED: step {run.item.key} not called: this process's heartbeat fell behind "
                "(stalled, or the store unreachable)",
            )
            admission.call_ended(conn, run.item, entered.run_id, None, tx.now, tx.hub.settings)
            if not step_ran:
                leases.call_not_made(conn, entered)
    except Exception as exc:
        log.warning(
            "message %s: could not let go of step %s's lease (%s); the lease repair does",
            run.message_id,
            run.item.key,
            exc,
        )
        return
    carry_out(run.hub, follow, run.clock())


def new_run(runs: ExitStack) -> str:
    return runs.enter_context(running())  # listed before its lease is taken


# --- the step itself, outside any transaction ------------------------------------------------------------


def outcome(run: StepRun, entered: Entered) -> Verdict:
    """Run the step (outside any transaction) and tell how it ended; Fenced where its call was refused
    (openhub.store.workers.check_fence: HttpCall, `ctx.check_fence()`), also where the step caught that."""
    item = run.item
    called = time.monotonic()  # a batch's member waits its turn and the others' ends: the call's own time
    # What the step sends as secrets (HttpCall notes them) and its route's secret fields are redacted from
    # every text made meanwhile: its error, its log lines, its spans (openhub.core.redact).
    secrets = secret_values(entered.ctx.payload, run.route.secret_fields) if run.route.secret_fields else ()
    with (
        secrets_scope(secrets),
        step_span(run.route.name, item.key, entered.ctx, entered.row.traceparent) as traced,
    ):  # openhub.core.tracing
        with fencing(entered.started):
            verdict = _run(run, entered.ctx)
        entered.call_ms = int((time.monotonic() - called) * 1000)
        traced.ended(verdict.event and verdict.event.value, verdict.code, error_line(verdict.error))
    if isinstance(item, Split) and verdict.event in (Event.SPLIT, None):
        try:
            verdict.children = prepare_children(run.hub, entered.row, item, verdict.children, run.clock())
        except Reject as exc:
            verdict = Verdict(Event.REJECTED, error=f"Reject: {exc.reason}", code=codes.SPLIT)
    if verdict.event is None and run.route.sync and run.last:
        try:
            verdict.result = dumps(verdict.result)  # stored as the route's result (a sync caller's answer)
        except (TypeError, ValueError) as exc:
            verdict = Verdict(
                Event.REJECTED,
                call_state=verdict.effect(),
                code=codes.RESULT,
                error=f"step {item.key!r} of sync route {run.route.name!r} returned a result that "
                f"is not JSON-serialisable: {exc}",
            )
    try:
        entered.custom_data = dumps(entered.ctx.custom_data)
    except (TypeError, ValueError) as exc:  # kept as it was; the call itself is recorded for what it did
        verdict = Verdict(
            Event.REJECTED,
            call_state=verdict.effect(),
            code=codes.CUSTOM_DATA,
            error=f"step {item.key!r} left custom_data that is not JSON-serialisable: {exc}",
        )
    return verdict


def _run(run: StepRun, ctx: StepContext) -> Verdict:
    item = run.item
    try:
        with run.limit(step_timeout(item, run.hub.settings).total_seconds()) if run.limit else nullcontext():
            result = item.fn(ctx)
        if isinstance(item, Split):  # unbound: a success that writes children, and the route goes on
            return Verdict(Event.SPLIT if item.bound else None, children=list(result or []))
        return Verdict(None, result=result if run.route.sync and run.last else None)
    except WaitForResponse as exc:
        return Verdict(Event.WAIT_RESPONSE, delay=exc.timeout)
    except NoEffect:
        return Verdict(Event.NO_EFFECT, error="no effect", code=codes.NO_EFFECT)
    except Postpone as exc:
        return Verdict(Event.POSTPONED, delay=exc.delay, error=exc.reason)
    except Holdback as exc:
        return Verdict(Event.HELD_BACK, error=exc.reason)
    except Fenced:
        raise
    except Exception as exc:  # fatal by class (Reject, fatal=, validation, HTTP 4xx), else transient: a fault to retry
        code = error_code(exc)
        if not is_fatal(exc, run.route.fatal + item.fatal):
            return Verdict(
                Event.TRANSIENT, error=traceback.format_exc(), code=code, against_system=counts_against_system(exc)
            )
        if isinstance(exc, Reject):
            if exc.code and not is_declared(run.route, exc.code):  # computed at run time: not checked at load
                log.warning(
                    "route %s, step %s: error code %r is not declared in the route's errors=",
                    run.route.name,
                    item.key,
                    exc.code,
                )
            return Verdict(
                Event.REJECTED, error=f"Reject: {exc.reason}" + (f" [{exc.code}]" if exc.code else ""), code=code
            )
        return Verdict(Event.REJECTED, error=traceback.format_exc(), code=code)


# --- writing what it came to ------------------------------------------------------------------------------


def _stored(run: StepRun, what: str, write: Callable[[Tx], T]) -> tuple[T, FollowUps]:
    """`write` in one transaction, and what it asks for after commit; never given up while the store is
    away (this process lives: the lease stays ours, its heartbeat tells the poller so)."""
    attempt = 0
    while True:
        follow = FollowUps()
        try:
            with run.hub.transaction() as conn:
                result = write(Tx(conn, run.clock(), follow, run.hub))
            return result, follow
        except StoreUnavailable as exc:
            attempt += 1
            log.warning("message %s: %s step %s failed (%s); trying again", run.message_id, what, run.item.key, exc)
            pause_before_retry(outage_pause(attempt))


def _hand_over(
    run: StepRun, entered: Entered, verdict: Verdict, next_run: str, follow: FollowUps
) -> Entered | bool | None:
    """Record the step's success and enter the next step in one transaction (a fused task).

    A store that is away is waited for, as `_record_outcome` does. None when it could not be done
    for another reason (a bug, Celery's time limit): the caller then records the step alone, so the
    step's success is never mislabelled by a fault of the step after it.
    """
    try:
        entered_next, handed = _stored(
            run, "handing over", partial(record_and_enter, run=run, entered=entered, verdict=verdict, next_run=next_run)
        )
    except Exception as exc:
        if not interrupted(run, exc):
            log.exception(
                "message %s: handing step %s over to the next failed; recording it alone", run.message_id, run.item.key
            )
        return None
    follow.merge(handed)
    return entered_next


def record_and_enter(tx: Tx, run: StepRun, entered: Entered, verdict: Verdict, next_run: str) -> Entered | bool:
    # The compare-and-set of `record`, taking the next step's lease in the same statement.
    values = handover_values(tx, run, entered, next_run)
    taken, call_taken = leases.write_outcome(tx.conn, run, entered, verdict, values, tx.now, hand_over=True)
    if taken is None:  # the lease was lost: discard the outcome as `record` does
        return record(tx, run, entered, verdict)
    return handed_over(tx, run, entered, verdict, next_run, taken, call_taken)


def handover_values(tx: Tx, run: StepRun, entered: Entered, next_run: str) -> dict[str, Any]:
    """The message's columns `record_and_enter` writes: the next step's lease, what the step kept."""
    row = entered.row
    errors = loads(row.business_errors, []) + entered.ctx.business_errors
    return dict(
        leases.lease(run.next().item, next_run, tx.now, tx.hub.settings),
        custom_data=entered.custom_data if entered.custom_data is not None else row.custom_data,
        business_errors=dumps(errors) if errors else None,
    )


def handed_over(
    tx: Tx, run: StepRun, entered: Entered, verdict: Verdict, next_run: str, taken: Any, call_taken: bool
) -> Entered | bool:
    """After the compare-and-set of a hand-over held (`taken`, the row written): the next step entered."""
    admission.call_ended(tx.conn, run.item, entered.run_id, verdict, tx.now, tx.hub.settings)
    return entry.prepare(tx, run.next(), taken, next_run, call_taken)


def _record_outcome(run: StepRun, entered: Entered, verdict: Verdict) -> tuple[FollowUps, bool, Verdict]:
    """Write a step's outcome; never give up while this process lives, or a repair would call again.

    The lease stays ours meanwhile: the heartbeat tells the poller this process is alive. A store
    that is away is waited for; a write that fails for any other reason (a bug, a follow-up that
    cannot be carried out) is replaced by a transient failure that still records what the call did.
    """
    while True:
        try:
            go_on, recorded = _stored(run, "recording", partial(record, run=run, entered=entered, verdict=verdict))
            return recorded, go_on, verdict
        except Exception as exc:
            if interrupted(run, exc):
                continue  # Celery's soft time limit arrived while recording: the step itself is done
            if verdict.unrecorded:
                raise  # the fallback failed too: the lease repair takes over
            log.exception(
                "message %s: recording step %s failed; recorded as a transient failure", run.message_id, run.item.key
            )
            verdict = verdict.unrecordable(run.item.key, traceback.format_exc())


def _recorded_alone(run: StepRun, entered: Entered, verdict: Verdict) -> bool:
    """A step that succeeded and hands on to the next step's task (or ends a message nobody is told of),
    written in one statement that is its own transaction (`recording.fits_alone`: one round trip on
    PostgreSQL, no BEGIN or COMMIT). False
    where that did not write it (its lease lost, the store away, any fault): `_record_outcome` then writes
    it in a transaction, waiting for the store, and finds the lease lost where this statement committed
    unseen (as where a COMMIT's answer is lost: the chain's hand-over due re-publishes it)."""
    if not fits_alone(run, entered, verdict):
        return False
    try:
        with run.hub.single_statement() as conn:
            return record_alone(Tx(conn, run.clock(), FollowUps(), run.hub), run, entered, verdict)
    except Exception as exc:
        log.debug("message %s: step %s not recorded alone (%s)", run.message_id, run.item.key, exc)
        return False


def pause_before_retry(seconds: float) -> None:
    time.sleep(seconds)  # back off from an outage or a conflict; the step's outcome waits in memory


def interrupted(run: StepRun, exc: BaseException) -> bool:
    """A time limit stopped the work where it stood (the driver's, read as openhub's `Interrupted`)."""
    return isinstance(run.translate(exc), Interrupted)
