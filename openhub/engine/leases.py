"""The step lease and the external-call record: the one module that writes their columns.

A message's step lease is its columns `step_run` (the run holding it), `worker` (the process it
runs in) and `due_at` (when it runs out); a step's external-call record (table ext_calls) tells
whether its call was made and by which message. Here they are taken, kept, handed over to the next
step and let go, and a call is recorded before and after it is made — each as a named statement, as
procrastinate's manager runs the job SQL. The engine decides when; this module only writes.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from types import SimpleNamespace
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, bindparam, delete, literal, or_, select, true, update
from sqlalchemy.dialects import postgresql

from openhub.core.config import Settings
from openhub.core.model import Route, RouteStep
from openhub.core.policy import handover_due, lease_until
from openhub.core.runs import Entered, StepRun
from openhub.core.states import CallState, Note, State
from openhub.core.verdicts import Verdict, message_call_key
from openhub.store.db import insert_or_ignore, is_postgres
from openhub.store.queries import execute_noted, history_entry, history_pair_where, history_where, update_message
from openhub.store.schema import ext_calls, messages
from openhub.store.workers import current_id, current_node

X = ext_calls.c
M = messages.c


def lease(item: RouteStep, run_id: str, now: datetime, settings: Settings) -> dict[str, Any]:
    """The columns of a step lease held by this process's run `run_id`."""
    return dict(step_run=run_id, worker=current_id(), due_at=lease_until(item, now, settings), updated_at=now)


def dropped(*, keep_worker: bool = False) -> dict[str, Any]:
    """The columns of a message whose step lease is let go (with the state it leaves for);
    `keep_worker`: the process that held it stays named (it publishes what comes next)."""
    return dict(step_run=None) if keep_worker else dict(step_run=None, worker=None)


def between_steps(now: datetime, settings: Settings, *, publisher: str | None) -> dict[str, Any]:
    """The columns of a message between two steps: no lease; by then the next step's task must have
    taken it; `publisher` is the process that publishes that task (its death re-publishes the chain)."""
    return dict(step_run=None, worker=publisher, due_at=handover_due(now, settings))


# --- taking the lease ---------------------------------------------------------------------------------

# Only a free lease is taken. A run holding one is never taken over by another delivery of its task: its
# lease was written on one host's clock and would be judged over on another's (a taker 90 s ahead, or
# a holder or poller 90 s behind, took a lease still running and made the call again, issue 22). A run
# that ended without its outcome is the poller's to repair (a new token), by its worker's heartbeat.
_LEASE = (
    update(messages)
    .where(
        and_(
            M.id == bindparam("mid"),
            M.attempt_id == bindparam("token"),
            M.state == State.PROCESSING.value,
            M.step_run.is_(None),
        )
    )
    .values(
        step_run=bindparam("run"),
        worker=bindparam("holder"),
        due_at=bindparam("lease_until"),
        updated_at=bindparam("now"),
    )
    .returning(*messages.c)
)


def _first_call(source: Any) -> Any:
    # PostgreSQL: the step's first call record (message scope) of the message row the data-modifying CTE
    # `source` returns, inserted where there is none; the statement returns that row and `new_call`, the
    # record's id (None: it was there, or the row was not written).
    new = (
        postgresql.insert(ext_calls)
        .from_select(
            [
                "key",
                "message_id",
                "step_key",
                "scope",
                "state",
                "msg_timestamp",
                "attempts",
                "created_at",
                "updated_at",
                "worker",
            ],
            select(
                bindparam("n_key", type_=X.key.type),
                source.c.id,
                bindparam("n_step_key", type_=X.step_key.type),
                literal("message"),
                literal(CallState.PROCESSING.value),
                source.c.msg_timestamp,
                literal(1),
                bindparam("n_now", type_=X.created_at.type),
                bindparam("n_now", type_=X.created_at.type),
                bindparam("n_node", type_=X.worker.type),
            ),
        )
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(X.id)
        .cte("new_call")
    )
    return select(source, new.c.id.label("new_call")).select_from(source.outerjoin(new, true()))


_LEASE_AND_CALL = _first_call(_LEASE.cte("lease"))
# The same where the step has no call record yet, and only then: the lease is taken exactly where the record
# is inserted with it, so that nothing is left for another statement to do (`take_new`).
_LEASE_AND_NEW_CALL = _first_call(
    _LEASE.where(~select(X.id).where(X.key == bindparam("n_key", type_=X.key.type)).exists()).cte("lease")
)


def folds_call(conn: Connection, item: RouteStep) -> bool:
    """Whether the statement that takes the step's lease also inserts its first call record: on
    PostgreSQL, for a step with message scope and no system (whose circuit breaker and limits are
    consulted before a record is made)."""
    return item.scope == "message" and getattr(item, "system", None) is None and is_postgres(conn)


def _first_call_params(message_id: int, item: RouteStep, now: datetime) -> dict[str, Any]:
    return {"n_key": message_call_key(message_id, item), "n_step_key": item.key, "n_now": now, "n_node": current_node()}


def _with_first_call(row: Row[Any] | None) -> tuple[Any, bool]:
    """The message row of a `_first_call` statement, and whether the call record was inserted."""
    if row is None:
        return None, False
    values = dict(row._mapping)
    inserted = values.pop("new_call") is not None
    return SimpleNamespace(**values), inserted


def take(conn: Connection, run: StepRun, columns: dict[str, Any], now: datetime) -> tuple[Any, bool]:
    """The common case in one statement: the chain carrying the message takes the next step's lease
    (`columns`, of `lease`); the row, None where the lease is not free for this chain.

    On PostgreSQL, a step with message scope and no system (whose breaker and limits are consulted
    before a call record is made) gets its first call record in the same statement: the row, and
    whether that record was inserted.
    """
    params = _lease_params(run, columns, now)
    if not folds_call(conn, run.item):
        return conn.execute(_LEASE, params).first(), False
    return _with_first_call(
        conn.execute(_LEASE_AND_CALL, {**params, **_first_call_params(run.message_id, run.item, now)}).first()
    )


def take_new(conn: Connection, run: StepRun, columns: dict[str, Any], now: datetime) -> tuple[Any, bool]:
    """`take` in ONE statement that may run on its own (`store.db.single_statement`), for a step whose lease
    statement folds its first call record (`folds_call`): the lease is taken only where the step has no
    call record yet, and the record is inserted with it. The row and whether the record was inserted (False
    only where another statement inserted it in between: then the lease is ours without it); None where
    nothing was written (the lease not free for this chain, or a call record there): `take` in a
    transaction finds out what then."""
    assert folds_call(conn, run.item)
    params = {**_lease_params(run, columns, now), **_first_call_params(run.message_id, run.item, now)}
    return _with_first_call(conn.execute(_LEASE_AND_NEW_CALL, params).first())


def _lease_params(run: StepRun, columns: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The lease statements' parameters: this chain's message and token, and the lease's columns."""
    return {
        "mid": run.message_id,
        "token": run.token,
        "now": now,
        "run": columns["step_run"],
        "holder": columns["worker"],
        "lease_until": columns["due_at"],
    }


def hand_back(conn: Connection, message_id: int, now: datetime, settings: Settings) -> None:
    """A step found done before: its lease is let go and the next step's task must take the message in time."""
    update_message(conn, message_id, **between_steps(now, settings, publisher=None), updated_at=now)


# --- the external-call record before the call -----------------------------------------------------------

_NEW_CALL = {pg: insert_or_ignore(ext_calls, pg, index_elements=["key"]).returning(X.id) for pg in (False, True)}
_LOCK_CALL = {
    False: select(ext_calls).where(X.key == bindparam("call_key")),
    True: select(ext_calls).where(X.key == bindparam("call_key")).with_for_update(),
}


def take_call(conn: Connection, key: str, row: Any, item: RouteStep, now: datetime) -> Row[Any] | None:
    """The earlier external-call record for `key`, locked; None when this is the first call.

    A first call inserts its record (PROCESSING, attempt 1) in the same statement.
    """
    pg = is_postgres(conn)
    inserted = conn.execute(
        _NEW_CALL[pg],
        {
            "key": key,
            "message_id": row.id,
            "step_key": item.key,
            "scope": item.scope,
            "state": CallState.PROCESSING.value,
            "msg_timestamp": row.msg_timestamp,
            "attempts": 1,
            "created_at": now,
            "updated_at": now,
            "worker": current_node(),
        },
    ).first()
    if inserted is not None:
        return None
    return conn.execute(_LOCK_CALL[pg], {"call_key": key}).one()


def call_again(conn: Connection, key: str, row: Any, attempt: int, now: datetime) -> None:
    """An earlier record's call is made again, by this message, as its `attempt`-th attempt."""
    conn.execute(
        update(ext_calls)
        .where(X.key == key)
        .values(
            state=CallState.PROCESSING.value,
            message_id=row.id,
            msg_timestamp=row.msg_timestamp,
            updated_at=now,
            attempts=attempt,
            worker=current_node(),
        )
    )


def forget_call(conn: Connection, key: str) -> None:
    """Remove a call record this entry made for a call that did not happen."""
    conn.execute(delete(ext_calls).where(X.key == key))


def call_not_made(conn: Connection, entered: Entered) -> None:
    """The entered run's call did not happen (the fence stopped it before the step ran): its record goes
    back to what the run found (`Entered.call_before`), or goes where the run's entry inserted it, so the
    next run's attempt and `redelivered` count calls, not entries. A compare-and-set on the record as the
    entry left it: one another message took since (this process judged dead meanwhile) stays theirs."""
    mine = (X.key == entered.key) & (X.message_id == entered.row.id) & (X.state == CallState.PROCESSING.value)
    before = entered.call_before
    if before is None:
        conn.execute(delete(ext_calls).where(mine, X.attempts == 1))
        return
    conn.execute(
        update(ext_calls)
        .where(mine, X.attempts == entered.ctx.attempt)
        .values(
            state=before.state,
            message_id=before.message_id,
            msg_timestamp=before.msg_timestamp,
            updated_at=before.updated_at,
            attempts=before.attempts,
            worker=before.worker,
        )
    )


def first_step_not_done(conn: Connection, row: Any, route: Route, item: RouteStep) -> RouteStep:
    """From `item` on, the first step of the route whose call this message has not made successfully."""
    done = set(conn.execute(select(X.step_key).where(X.message_id == row.id, X.ok_message_id == row.id)).scalars())
    later = route.steps[route.steps.index(item) :]
    return next((step for step in later if step.key not in done), item)


# --- the outcome: keeping the lease, handing it over, letting it go -------------------------------------

# Compare-and-set of a step's outcome: written only while the step's lease is still this run's.
_HELD = and_(
    M.id == bindparam("mid"),
    M.attempt_id == bindparam("token"),
    M.step_run == bindparam("run"),
    M.state == State.PROCESSING.value,
)
_KEEP = update(messages).where(_HELD).returning(M.id)
# The same, handing the lease to the next step's run (a fused task): the updated row is returned.
_HAND_OVER = update(messages).where(_HELD).returning(*messages.c)
# Its parameters are named after no column: in a statement with data-modifying CTEs SQLAlchemy would
# take a parameter named after a column for one more SET column of every table the statement updates.
_CALL_DONE = (
    update(ext_calls)
    .where(and_(X.key == bindparam("c_key"), X.message_id == bindparam("mid")))
    .values(
        state=bindparam("c_state"),
        updated_at=bindparam("c_at"),
        duration_ms=bindparam("c_ms"),
        last_error=bindparam("c_error"),
        ok_message_id=bindparam("c_ok_id"),
        ok_msg_timestamp=bindparam("c_ok_ts"),
    )
)


def _call_done(entered: Entered, state: str, now: datetime, error: str | None = None) -> dict[str, Any]:
    """Parameters of _CALL_DONE: a call that succeeded names this message as its last success."""
    row = entered.row
    ok = state == CallState.OK
    return {
        "c_key": entered.key,
        "mid": row.id,
        "c_state": str(state),
        "c_at": now,
        "c_ms": entered.duration_ms(),
        "c_error": error,
        "c_ok_id": row.id if ok else entered.call_ok_id,
        "c_ok_ts": row.msg_timestamp if ok else entered.call_ok_ts,
    }


def _closing(
    run: StepRun, entered: Entered, verdict: Verdict, now: datetime
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The parameters of _CALL_DONE for a step's outcome, and of its step_ok entry where it succeeded."""
    row = entered.row
    error = verdict.error[-4000:] if verdict.error and verdict.call_state == CallState.FAILED else None
    done = _call_done(entered, verdict.call_state, now, error)
    if verdict.call_state not in (CallState.OK, CallState.WAITING):
        return done, None
    return done, history_entry(row.id, Note.STEP_OK.value, row.state, row.state, step=run.item.key, now=now)


@cache
def _outcome_statement(cas: Any, columns: tuple[str, ...], noted: bool, first_call: bool, ended: bool = False) -> Any:
    # The compare-and-set `cas` setting `columns` (as parameters m_<column>), with _CALL_DONE (and,
    # `noted`, the step_ok entry, `ended` followed by the message's final one; `first_call`, the next
    # step's first call record) as data-modifying CTEs that write only where it held. Built once per shape.
    keep = cas.values({c: bindparam(f"m_{c}") for c in columns}).cte("keep")
    held = select(keep.c.id).exists()
    history = (history_pair_where if ended else history_where)(held)
    ctes = [_CALL_DONE.where(held).cte("call_done")] + ([history.cte("history")] if noted else [])
    if first_call:
        return _first_call(keep).add_cte(*ctes)
    return select(keep, literal(None).label("new_call")).add_cte(*ctes)


def write_outcome(
    conn: Connection,
    run: StepRun,
    entered: Entered,
    verdict: Verdict,
    values: dict[str, Any],
    now: datetime,
    *,
    hand_over: bool = False,
    ended: dict[str, Any] | None = None,
) -> tuple[Any, bool]:
    """The compare-and-set of a step's outcome, writing `values` to the message: it counts only if the
    lease is still ours (no cancel, no repair). Where it held, what the step's external call did is
    written to its record, and a succeeded step to the history; `hand_over`: `values` take the next
    step's lease, and that step's first call record may be inserted too. Returns the row written (None,
    with nothing written, where the lease was lost), all of it when handed over (else its id), and
    whether that record was. On PostgreSQL all of it is one statement. `ended` (PostgreSQL, a step that
    succeeded, `queries.second_entry`): `values` end the message, and its final history entry follows the
    step's step_ok entry, in the same statement."""
    keep = _HAND_OVER if hand_over else _KEEP
    if is_postgres(conn):
        params, noted, fold = outcome_params(conn, run, entered, verdict, now, hand_over)
        assert ended is None or noted
        statement = _outcome_statement(keep, tuple(sorted(values)), noted, fold, ended is not None)
        params.update({f"m_{c}": v for c, v in values.items()}, **(ended or {}))
        return _with_first_call(conn.execute(statement, params).first())
    done, entry = _closing(run, entered, verdict, now)
    cas = {"mid": run.message_id, "token": run.token, "run": entered.run_id}
    kept = conn.execute(keep, {**cas, **values}).first()
    if kept is not None and entry is not None:
        execute_noted(conn, _CALL_DONE, done, entry)
    elif kept is not None:
        conn.execute(_CALL_DONE, done)
    return kept, False


def outcome_params(
    conn: Connection, run: StepRun, entered: Entered, verdict: Verdict, now: datetime, hand: bool
) -> tuple[dict[str, Any], bool, bool]:
    """PostgreSQL: `write_outcome`'s parameters but the message's columns (a batch's set statement's too,
    openhub.engine.batch_writes); whether it writes the step_ok entry, the next step's first call record."""
    done, entry = _closing(run, entered, verdict, now)
    params = {"mid": run.message_id, "token": run.token, "run": entered.run_id, **done, **(entry or {})}
    next_item = run.route.steps[run.index + 1] if hand else None
    fold = next_item is not None and folds_call(conn, next_item)
    if next_item is not None and fold:
        params.update(_first_call_params(run.message_id, next_item, now))
    return params, entry is not None, fold


def answered(conn: Connection, entered: Entered, now: datetime) -> None:
    """A waiting step's response is here: its call is OK."""
    conn.execute(_CALL_DONE, _call_done(entered, CallState.OK, now))


def let_go_lost(conn: Connection, entered: Entered, verdict: Verdict, now: datetime) -> bool:
    """A run whose lease was lost meanwhile (cancelled, repaired) ends without writing its outcome: a call
    that did succeed is recorded so (a later run must not make it again; a sync route's result with it), and
    a cancelled message that
    kept this run as in flight lets it go. Whether that message holds a funnel (it may go on now)."""
    if verdict.effect() == CallState.OK:
        done = conn.execute(
            _CALL_DONE.where(X.state == CallState.PROCESSING.value), _call_done(entered, CallState.OK, now)
        )
        if done.rowcount and verdict.result is not None:
            # A sync route's last call: a later run skips it as done, so its result is kept now, or the
            # message would end OK without one (a total restart since forgot the call: rowcount 0).
            conn.execute(update(messages).where(M.id == entered.row.id).values(result=verdict.result))
    return let_go_run(conn, entered.row.id, entered.run_id)


def let_go_run(conn: Connection, message_id: int, run_id: str) -> bool:
    """A run whose lease was lost lets go of the message where a cancel kept it as in flight; whether that
    message holds a funnel (it may go on now)."""
    released = conn.execute(
        update(messages).where(and_(M.id == message_id, M.step_run == run_id)).values(**dropped()).returning(M.funnel)
    ).first()
    return released is not None and released.funnel is not None


# --- an operator's writes: a total restart, a response's call record ---------------------------------------------


def forget_calls(conn: Connection, row: Any) -> None:
    """A total restart: the message's own call records go, so every call is made again; one it took over
    from an older message that had succeeded (an entity record) keeps that success, or the older
    message's retry would call again."""
    conn.execute(
        delete(ext_calls).where(and_(X.message_id == row.id, or_(X.ok_message_id.is_(None), X.ok_message_id == row.id)))
    )
    conn.execute(update(ext_calls).where(X.ok_message_id == row.id).values(ok_message_id=None, ok_msg_timestamp=None))


def forget_calls_of(conn: Connection, row: Any, step_keys: list[str]) -> list[dict[str, Any]]:
    """A restart from a step: the message's call records of `step_keys` go (as `forget_calls` does for all of
    them), so those steps call again and the others never do; what was cleared (for the history)."""
    mine = and_(X.message_id == row.id, X.step_key.in_(step_keys))
    cleared = [
        {"step": r.step_key, "key": r.key, "state": r.state, "attempts": r.attempts}
        for r in conn.execute(select(ext_calls).where(mine).order_by(X.id))
    ]
    conn.execute(delete(ext_calls).where(and_(mine, or_(X.ok_message_id.is_(None), X.ok_message_id == row.id))))
    conn.execute(
        update(ext_calls)
        .where(and_(X.ok_message_id == row.id, X.step_key.in_(step_keys)))
        .values(ok_message_id=None, ok_msg_timestamp=None)
    )
    return cleared


def responded(conn: Connection, row: Any, now: datetime) -> None:
    """The response a message waited for came: its waiting calls are OK, made by it."""
    conn.execute(
        update(ext_calls)
        .where(and_(X.message_id == row.id, X.state == CallState.WAITING.value))
        .values(state=CallState.OK.value, ok_message_id=row.id, ok_msg_timestamp=row.msg_timestamp, updated_at=now)
    )


# --- the repairs' writes (poller, due scan) ---------------------------------------------------------------


def release_run(conn: Connection, message_id: int, now: datetime) -> None:
    """A cancelled message's last run is over: its lease is let go."""
    update_message(conn, message_id, **dropped(), updated_at=now)


def orphan_chains_due(conn: Connection, dead: set[str], now: datetime) -> None:
    """Between two steps the worker that ran the first is the one that publishes the second's task: where
    it died, the chain is due now, to be published again at once (no failure counted)."""
    conn.execute(
        update(messages)
        .where(M.worker.in_(dead), M.step_run.is_(None), M.state.in_((State.PROCESSING.value, State.IN_QUEUE.value)))
        .values(worker=None, due_at=now)
    )


def in_broker() -> ColumnElement[bool]:
    """The messages whose chain was handed to the broker and not yet taken from it: a NEW or IN_QUEUE
    message's first task, or the next step's task of one between two steps."""
    return or_(
        M.state.in_((State.NEW.value, State.IN_QUEUE.value)),
        and_(M.state == State.PROCESSING.value, M.step_run.is_(None)),
    )


def chains_in_broker_due(conn: Connection, at: datetime) -> int:
    """The broker lost what it held: every chain that was in it (`in_broker`) is due at `at`, not after the
    lease grace (sooner ones keep their time); how many."""
    return conn.execute(update(messages).where(M.due_at > at, in_broker()).values(due_at=at)).rowcount


def extend(conn: Connection, message_id: int, now: datetime, settings: Settings) -> None:
    """A slow step whose worker's heartbeat still lists its run, or a chain whose task still waits in the
    broker's queue: its lease (or hand-over) is extended."""
    update_message(conn, message_id, due_at=handover_due(now, settings))


def waiting_calls_failed(conn: Connection, message_id: int, reason: str, now: datetime) -> None:
    """No response came before the timeout: the message's waiting calls are FAILED (made again next time)."""
    conn.execute(
        update(ext_calls)
        .where(and_(X.message_id == message_id, X.state == CallState.WAITING.value))
        .values(state=CallState.FAILED.value, last_error=reason, updated_at=now)
    )
