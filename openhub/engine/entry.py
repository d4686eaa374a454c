"""Entering a step, in one transaction: claim the message (its chain's first task) or check the chain's fencing
token, take the step lease, and consult the step's external-call record; what comes out is an `Entered` run, or
why the step does not run (openhub.engine.engine orders the parts: this, the step, openhub.engine.recording)."""

from __future__ import annotations

import logging
import time
from typing import Any

from openhub.core import codes
from openhub.core.context import StepContext
from openhub.core.model import Split
from openhub.core.runs import Entered, StepRun
from openhub.core.states import CallState, Event, State
from openhub.core.verdicts import Verdict, call_key, idempotency_key, message_info
from openhub.engine import admission, leases
from openhub.engine.admission import Refusal
from openhub.engine.batch_claims import claim_all
from openhub.engine.lifecycle import FollowUps, Tx, apply_event, resume_split
from openhub.engine.recording import finish, row_with
from openhub.store.queries import loads, lock_message

log = logging.getLogger("openhub.engine")


def enter(tx: Tx, run: StepRun, run_id: str) -> Entered | bool:
    lease = leases.lease(run.item, run_id, tx.now, tx.hub.settings)
    # The route's first step finds its message NEW or IN_QUEUE, to be claimed: the lease would not take it.
    row, call_taken = (None, False) if run.index == 0 else leases.take(tx.conn, run, lease, tx.now)
    if row is None:  # not a chain going on to its next step: find out why, under the row lock
        row = lock_message(tx.conn, run.message_id)
        if row is None or row.attempt_id != run.token:
            log.info("message %s: stale chain (token changed), stopping without effect", run.message_id)
            return False
        if run.index == 0 and row.state == State.PROCESSING:  # the first task delivered again: as any step's
            row, call_taken = leases.take(tx.conn, run, lease, tx.now)
            if row is None:
                log.info(
                    "message %s is PROCESSING and another run holds the step lease: this chain stops", run.message_id
                )
                return False
        elif row.state not in (State.NEW, State.IN_QUEUE):
            log.info(
                "message %s is %s%s: this chain stops",
                run.message_id,
                row.state,
                " and another run holds the step lease" if row.state == State.PROCESSING else "",
            )
            return False
        else:
            if not _claim(tx, row, run, lease):
                return False
            row = row_with(
                row,
                state=State.PROCESSING.value,
                attempts=row.attempts + 1,
                started_at=row.started_at or tx.now,
                blocked_since=None,
                **lease,
            )
    return prepare(tx, run, row, run_id, call_taken)


def enter_alone(run: StepRun, run_id: str, follow: FollowUps) -> Entered | bool | None:
    """`enter` for the common case in ONE statement that is its own transaction (`Hub.single_statement`: on
    PostgreSQL no BEGIN or COMMIT round trip): for a step with message scope and no system, the route's first
    step claims its message as a batch's members are claimed (`batch_claims.claim_all`: the compare-and-set,
    the route's pauses, the CLAIMED history entry and the first call record in the statement), a later step
    takes its lease with its first call record (`leases.take_new`). Nothing else is left to write then: with
    the record just inserted `prepare` asks nothing of the store. None where the statement wrote nothing (not
    such a step, SQLite, a retry, a stale or redelivered chain, a route paused, a call record there): `enter`
    in a transaction finds out why, as before."""
    hub, item = run.hub, run.item
    if hub.settings.database_url.startswith("sqlite") or item.scope != "message" or getattr(item, "system", None):
        return None
    # The lease is durable once the statement commits, on the server, before its answer is read: the run's
    # start as the fence judges it (`Entered.started`, `workers.fenced`) is read before the statement is sent,
    # as a transaction's is before its COMMIT (a heartbeat gap that ends while the answer travels fences it).
    started = time.monotonic()
    with hub.single_statement() as conn:
        tx = Tx(conn, run.clock(), follow, hub)
        if run.index == 0:
            row, inserted = claim_all(tx, [(run, run_id)])[0]
        else:
            row, inserted = leases.take_new(conn, run, leases.lease(item, run_id, tx.now, hub.settings), tx.now)
    if row is None:
        return None
    if not inserted:  # the record was inserted in between by another statement: the rest in a transaction
        with hub.transaction() as conn:
            # The lease committed with the statement: a cancel, restart or repair may have come since, and
            # `prepare` writes without a compare-and-set (a step found done ends the message, a refusal
            # postpones it). Under the row lock, as `enter` does in the transaction that takes the lease.
            row = lock_message(conn, run.message_id)
            if row is None or (row.attempt_id, row.step_run, row.state) != (run.token, run_id, State.PROCESSING):
                log.info(
                    "message %s: step %s's lease was lost as it was entered: this chain stops", run.message_id, item.key
                )
                # A cancel kept this run as in flight: no call was made, it ends now (as `recorded` lets go).
                if row is not None and row.step_run == run_id and leases.let_go_run(conn, run.message_id, run_id):
                    follow.funnels.append(run.message_id)
                return False
            return prepare(Tx(conn, tx.now, follow, hub), run, row, run_id, started=started)
    # No statement follows (the closed connection would refuse one): the step's own record is new.
    return prepare(tx, run, row, run_id, call_taken=True, started=started)


def _claim(tx: Tx, row: Any, run: StepRun, lease: dict[str, Any]) -> bool:
    """The chain's first task takes a NEW/IN_QUEUE message, unless admission refuses it."""
    refusal = admission.claim(tx.conn, row, run.route, tx.now, tx.hub.settings)
    if refusal is not None:
        _refuse(tx, row, run, refusal)
        return False
    # A retry's chain starts at the route's first step and skips those already OK: the history names
    # the step the attempt resumes at, as its call records tell (a first attempt has none to read).
    resumes = leases.first_step_not_done(tx.conn, row, run.route, run.item) if row.attempts else run.item
    apply_event(
        tx,
        row,
        Event.CLAIMED,
        run.route,
        resumes,
        attempts=row.attempts + 1,
        started_at=row.started_at or tx.now,
        blocked_since=None,
        **lease,
    )
    return True


def _refuse(tx: Tx, row: Any, run: StepRun, refusal: Refusal) -> None:
    """Write what admission refused, instead of the step."""
    apply_event(tx, row, refusal.event, run.route, run.item, detail=refusal.detail, **refusal.values)


def prepare(
    tx: Tx, run: StepRun, row: Any, run_id: str, call_taken: bool = False, *, started: float | None = None
) -> Entered | bool:
    """With the step lease ours: the step's context and its external-call record (or why it does not run);
    `call_taken`: the statement that took the lease inserted the step's first call record; `started`: the
    monotonic time before the lease was sent where it has committed already (`enter_alone`), else now (in
    the transaction that takes it, before its COMMIT)."""
    item, conn = run.item, tx.conn
    ctx = StepContext(
        payload=loads(row.payload),
        message=message_info(row),
        idempotency_key=idempotency_key(row, item),
        attempt=1,
        redelivered=run.redelivered,
        custom_data=loads(row.custom_data, {}),
        response=loads(row.response),
        wait_token=run_id,
        settings=tx.hub.settings,
    )
    try:
        key = call_key(row, item, ctx)
    except Exception as exc:  # a custom key that cannot be computed is the message's fault
        finish(tx, row, run, Verdict(Event.REJECTED, error=f"{exc}", code=codes.CUSTOM_KEY))
        return False
    refusal = admission.breaker_open(conn, item, tx.now, tx.hub.settings)
    if refusal is not None:
        _refuse(tx, row, run, refusal)
        return False
    call = None if call_taken else leases.take_call(conn, key, row, item, tx.now)
    if call is not None and call.ok_message_id == row.id:  # this message's call already succeeded
        if isinstance(item, Split) and item.bound and not resume_split(tx, row, item):
            return False
        log.debug("message %s: step %s already OK, skipped", row.id, item.key)
        if run.last:
            finish(tx, row, run, Verdict(Event.COMPLETED))
            return False
        leases.hand_back(conn, row.id, tx.now, tx.hub.settings)
        return True
    settings = tx.hub.settings
    refusal = admission.against_record(conn, row, key, call, tx.now, settings) or admission.system_busy(
        conn, item, run_id, row.due_at, tx.now, settings
    )
    if refusal is not None:
        if call is None:  # its record was made by this entry, and no call happened
            leases.forget_call(conn, key)
        _refuse(tx, row, run, refusal)
        return False
    if call is not None:
        ctx.attempt = call.attempts + 1 if call.message_id == row.id else 1
        # This message's own call was begun and has no outcome: the run that began it ended unseen (its worker
        # died, or it was fenced), and the system may have had the call. Like JMSRedelivered, a step can ask.
        ctx.redelivered = ctx.redelivered or (call.message_id == row.id and call.state == CallState.PROCESSING)
        leases.call_again(conn, key, row, ctx.attempt, tx.now)
    return Entered(
        run_id=run_id,
        key=key,
        ctx=ctx,
        row=row_with(row),
        started=time.monotonic() if started is None else started,
        call_before=call,
    )
