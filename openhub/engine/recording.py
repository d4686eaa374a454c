"""Writing what a step came to, in the transaction that holds its lease (openhub.engine.engine orders the parts:
enter, the step, this): its outcome under the lease's compare-and-set, then the state its verdict asks for.

`finish` is also what ends a chain at its entry (openhub.engine.entry: a custom key that cannot be computed, a
last step already done)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from openhub.core.model import Split
from openhub.core.policy import retry_policy, verdict_due
from openhub.core.runs import Entered, StepRun
from openhub.core.states import Action, CallState, Event, State, transition
from openhub.core.verdicts import Verdict
from openhub.engine import admission, leases, waits
from openhub.engine.lifecycle import Tx, apply_event, redispatch
from openhub.engine.split import write_children
from openhub.store.queries import dumps, loads, second_entry
from openhub.store.workers import current_id

log = logging.getLogger("openhub.engine")


def record(tx: Tx, run: StepRun, entered: Entered, verdict: Verdict) -> bool:
    common = record_values(tx, run, entered, verdict)
    kept, _ = leases.write_outcome(tx.conn, run, entered, verdict, common, tx.now)
    return recorded(tx, run, entered, verdict, common, kept)


def fits_alone(run: StepRun, entered: Entered, verdict: Verdict) -> bool:
    """Whether `record` writes nothing but its compare-and-set (one statement on PostgreSQL: `record_alone`):
    a step that succeeded, with no system (whose slot and breaker are told) and no children to write, that
    hands on to the next step's task, or that is the route's last and ends a message nobody else is told of
    (no split parent to settle, no funnel to let go, no confirmer of its source system, no hooks on OK, not
    a sync route's)."""
    if (
        verdict.event is not None
        or verdict.children
        or getattr(run.item, "system", None) is not None
        or run.hub.settings.database_url.startswith("sqlite")
    ):
        return False
    if not run.last:
        return True
    row, registry = entered.row, run.hub.registry
    return (
        row.state == State.PROCESSING.value
        and row.parent_id is None
        and row.funnel is None
        and not run.route.sync
        and not isinstance(run.item, Split)
        and registry.confirmers.get(row.source_system) is None
        and not registry.hooks_for(State.OK.value)
        and not transition(row.state, Event.COMPLETED, row.failed_count).actions - _TOLD_NOBODY
    )


# What COMPLETED does beyond its columns, none of which applies where `fits_alone` holds.
_TOLD_NOBODY = {Action.CONFIRM, Action.RELEASE_FUNNEL, Action.NOTIFY_PARENT}


def record_alone(tx: Tx, run: StepRun, entered: Entered, verdict: Verdict) -> bool:
    """`record` where `fits_alone`, on a connection for one statement (`Hub.single_statement`): whether its
    compare-and-set held (False: nothing written, the lease was lost; `record` in a transaction then). The
    last step's statement ends the message too, as `finish` would with COMPLETED: the state table's columns
    and the history entry after the step's own."""
    common = record_values(tx, run, entered, verdict)
    ended = None
    if run.last:
        row = entered.row
        result = transition(row.state, Event.COMPLETED, row.failed_count)
        common.update(
            state=result.state.value,
            failed_count=result.failed_count,
            due_at=None,
            finished_at=tx.now,
            **leases.dropped(),
        )
        ended = second_entry(Event.COMPLETED.value, result.state.value, Verdict(Event.COMPLETED).short())
    kept, _ = leases.write_outcome(tx.conn, run, entered, verdict, common, tx.now, ended=ended)
    return kept is not None


def record_values(tx: Tx, run: StepRun, entered: Entered, verdict: Verdict) -> dict[str, Any]:
    """The message's columns `record` writes under the lease's compare-and-set."""
    row = entered.row  # still accurate: the step lease kept everyone else off the message
    # A failed attempt's business errors are not kept: the retry reports them again if they still hold.
    errors = loads(row.business_errors, []) + (entered.ctx.business_errors if verdict.succeeded else [])
    common = dict(
        custom_data=entered.custom_data if entered.custom_data is not None else row.custom_data,
        business_errors=dumps(errors) if errors else None,
        **leases.dropped(),
        updated_at=tx.now,
    )
    if verdict.result is not None and verdict.call_state == CallState.OK:
        # A sync route's last call succeeded: its result is kept with it, whatever the verdict written (a
        # store failure's UNRECORDED retry skips the call as done, and must find the result there).
        common["result"] = verdict.result
    if verdict.event is None and not run.last:
        # The next step's task must arrive in time; this worker publishes it: named here, its death
        # re-publishes the chain at once.
        common.update(leases.between_steps(tx.now, tx.hub.settings, publisher=current_id()))
    return common


def recorded(tx: Tx, run: StepRun, entered: Entered, verdict: Verdict, common: dict[str, Any], kept: Any) -> bool:
    """After `record`'s compare-and-set (`kept`: the row written, None where the lease was lost): the rest."""
    item, row = run.item, entered.row
    if kept is None:
        log.warning(
            "message %s: step %s finished after its lease was lost; outcome discarded", run.message_id, item.key
        )
        admission.call_ended(tx.conn, item, entered.run_id, None, tx.now, tx.hub.settings)
        # A cancelled message kept this run as in flight: it has ended now, and the funnel may go on.
        if leases.let_go_lost(tx.conn, entered, verdict, tx.now):
            tx.follow.funnels.append(run.message_id)
        return False
    admission.call_ended(tx.conn, item, entered.run_id, verdict, tx.now, tx.hub.settings)
    if verdict.event is None and verdict.children:  # an unbound split: its children, and the route goes on
        assert isinstance(item, Split)
        write_children(tx.conn, row.id, item, verdict.children)
        tx.follow.children.append(row.id)
    if verdict.event is None and not run.last:
        return True
    # The ask is written under the lease's compare-and-set (the row lock an answer's `respond` takes too):
    # an answer bound to this run's token came before it, or comes after it and finds the wait open.
    answered_meanwhile = verdict.event is Event.WAIT_RESPONSE and waits.asked(
        tx.conn, row.id, entered.run_id, item.key, tx.now
    )
    row = row_with(row, **common)
    finish(tx, row, run, verdict if verdict.event else Verdict(Event.COMPLETED))
    if answered_meanwhile:  # its answer came while the step ran: no need to wait for it
        leases.answered(tx.conn, entered, tx.now)
        redispatch(tx, row_with(row, state=State.WAITING_FOR_RES.value), Event.RESPONDED)
    return False


def finish(tx: Tx, row: Any, run: StepRun, verdict: Verdict, **values: Any) -> None:
    """Apply a verdict that ends this chain: final state, retry, postpone, wait or split."""
    settings = run.hub.settings
    item, event = run.item, verdict.event
    assert event is not None
    values.update(leases.dropped())
    if event in (Event.TRANSIENT, Event.REJECTED, Event.NO_EFFECT):
        values.update(failed_step=item.key, failed_error=verdict.error, error_code=verdict.code)
    if event in (Event.POSTPONED, Event.HELD_BACK, Event.WAIT_RESPONSE, Event.NO_EFFECT):
        values["due_at"] = verdict_due(event, verdict.delay, retry_policy(run.route, item, settings), tx.now, settings)
    elif event is Event.SPLIT:
        values["due_at"] = None
        assert isinstance(item, Split)
        write_children(tx.conn, row.id, item, verdict.children)
    apply_event(tx, row, event, run.route, item, detail=verdict.short(), **values)


def row_with(row: Any, **values: Any) -> SimpleNamespace:
    """A copy of a message row with some columns changed (what this transaction wrote)."""
    data = dict(row._mapping) if hasattr(row, "_mapping") else dict(vars(row))
    data.update(values)
    return SimpleNamespace(**data)
