"""A batch's outcomes written in one statement for the whole group (PostgreSQL; openhub.engine.batch).

`leases.write_outcome` writes one message's outcome in one statement: the compare-and-set of its step
lease (taking the next step's lease, or letting it go), its call record closed, its step_ok entry, the
next step's first call record. `write_all` writes the same for every member of a batch in ONE statement
per set of columns written (the hand-overs; the steps recorded): the members' parameters, the very ones
`write_outcome` would bind (`leases.outcome_params`), go in as arrays (`unnest`), and every part joins
the message rows the compare-and-set wrote, so it writes only for the members whose lease held, as the
one-message statement does. A member whose compare-and-set failed (its message cancelled, its lease
repaired) comes back without a row: the batch writes it alone, as it writes every member on SQLite
(`engine.record_and_enter` or `recording.record`, which then discard the outcome).

Counted on a batch of 20 messages x 3 steps (bench's `count` in issue 42's note): the outcomes took 60
statements, now 3 (one per step).
"""

from __future__ import annotations

from datetime import datetime
from functools import cache, partial
from types import SimpleNamespace
from typing import Any, Callable

from sqlalchemy import Column, Connection, Integer, column, text

from openhub.core.runs import Entered, StepRun
from openhub.core.states import CallState, State
from openhub.core.verdicts import Verdict
from openhub.engine import leases
from openhub.engine.engine import handed_over, handover_values
from openhub.engine.lifecycle import Tx
from openhub.engine.recording import record_values, recorded
from openhub.store.schema import ext_calls, messages, transitions

__all__ = ["write_all", "write_together"]

M, X, T = messages.c, ext_calls.c, transitions.c

# Each parameter of `leases.outcome_params` (other than the message's columns, m_<column>) and the
# column it is written to (or compared with): its array's type, its bind processing (redaction).
_PARAMS: dict[str, Column[Any]] = {
    "mid": M.id,
    "token": M.attempt_id,
    "run": M.step_run,
    "c_key": X.key,
    "c_state": X.state,
    "c_at": X.updated_at,
    "c_ms": X.duration_ms,
    "c_error": X.last_error,
    "c_ok_id": X.ok_message_id,
    "c_ok_ts": X.ok_msg_timestamp,
    "h_at": T.at,
    "h_event": T.event,
    "h_from": T.from_state,
    "h_to": T.to_state,
    "h_step": T.step_key,
    "h_detail": T.detail,
    "n_key": X.key,
    "n_step_key": X.step_key,
    "n_now": X.created_at,
    "n_node": X.worker,
}


@cache
def _statement(columns: tuple[str, ...], types: tuple[str, ...]) -> Any:
    # The set statement for messages' columns `columns`; `types`: the SQL type of each parameter
    # (those of _PARAMS, then m_<column> of `columns`), for its array's cast. Built once per shape.
    names = [*_PARAMS, *(f"m_{c}" for c in columns)]
    arrays = ", ".join(f"CAST(:{n} AS {t}[])" for n, t in zip(names, types))
    sets = ", ".join(f"{c} = v.m_{c}" for c in columns)
    sql = f"""
WITH v AS (SELECT * FROM unnest({arrays}, CAST(:h_noted AS BOOLEAN[])) AS v({", ".join(names)}, h_noted)),
keep AS (
    UPDATE messages SET {sets} FROM v
    WHERE messages.id = v.mid AND messages.attempt_id = v.token AND messages.step_run = v.run
        AND messages.state = '{State.PROCESSING.value}'
    RETURNING messages.*
),
call_done AS (
    UPDATE ext_calls SET state = v.c_state, updated_at = v.c_at, duration_ms = v.c_ms, last_error = v.c_error,
        ok_message_id = v.c_ok_id, ok_msg_timestamp = v.c_ok_ts
    FROM v JOIN keep ON keep.id = v.mid
    WHERE ext_calls.key = v.c_key AND ext_calls.message_id = v.mid
),
history AS (
    INSERT INTO transitions (message_id, at, event, from_state, to_state, step_key, detail)
    SELECT v.mid, v.h_at, v.h_event, v.h_from, v.h_to, v.h_step, v.h_detail FROM v JOIN keep ON keep.id = v.mid
    WHERE v.h_noted
),
new_call AS (
    INSERT INTO ext_calls (key, message_id, step_key, scope, state, msg_timestamp, attempts, created_at,
        updated_at, worker)
    SELECT v.n_key, keep.id, v.n_step_key, 'message', '{CallState.PROCESSING.value}', keep.msg_timestamp, 1,
        v.n_now, v.n_now, v.n_node
    FROM v JOIN keep ON keep.id = v.mid
    WHERE v.n_key IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING id, message_id
)
SELECT keep.*, new_call.id AS new_call FROM keep LEFT JOIN new_call ON new_call.message_id = keep.id
"""
    return text(sql).columns(*messages.c, column("new_call", Integer))


def write_together(
    tx: Tx, steps: list[tuple[StepRun, Entered, Verdict, str | None]]
) -> list[Callable[[Tx], Any] | None]:
    """The outcome of each (run, entered, verdict, next step's run id) of `steps`, the steps of different
    messages: handed over to the next step's run as `engine.record_and_enter` does (a run id given), else
    recorded as `recording.record` does, their compare-and-sets in one statement per set of columns; per
    step, in order, the rest of its write (`engine.handed_over`, `recording.recorded`) or None where the
    lease was lost and nothing of that step was written."""
    items = []
    for run, entered, verdict, next_run in steps:
        if next_run is not None:
            items.append((run, entered, verdict, handover_values(tx, run, entered, next_run), True))
        else:
            items.append((run, entered, verdict, record_values(tx, run, entered, verdict), False))
    rests: list[Callable[[Tx], Any] | None] = []
    for (run, entered, verdict, values, hand_over), (row, call_taken), step in zip(
        items, write_all(tx.conn, items, tx.now), steps
    ):
        done = dict(run=run, entered=entered, verdict=verdict)
        if row is None:
            rests.append(None)
        elif hand_over:
            rests.append(partial(handed_over, **done, next_run=step[3], taken=row, call_taken=call_taken))
        else:
            rests.append(partial(recorded, **done, common=values, kept=row))
    return rests


def write_all(
    conn: Connection, items: list[tuple[StepRun, Entered, Verdict, dict[str, Any], bool]], now: datetime
) -> list[tuple[Any, bool]]:
    """`leases.write_outcome(conn, run, entered, verdict, values, now, hand_over=hand_over)` for each (run,
    entered, verdict, values, hand_over) of `items`, the steps of different messages, in one statement per
    set of columns written: per item, in order, the row written and whether the next step's first call
    record was inserted; (None, False) where the lease was lost and nothing of that item was written."""
    shapes: dict[tuple[bool, tuple[str, ...]], list[int]] = {}
    for i, (*_, values, hand_over) in enumerate(items):
        shapes.setdefault((hand_over, tuple(sorted(values))), []).append(i)
    written: dict[int, tuple[Any, bool]] = {}
    for (hand_over, columns), indexes in shapes.items():
        rows = _write_shape(conn, [items[i] for i in indexes], columns, hand_over, now)
        written.update({i: rows.get(items[i][0].message_id, (None, False)) for i in indexes})
    return [written[i] for i in range(len(items))]


def _write_shape(
    conn: Connection,
    items: list[tuple[StepRun, Entered, Verdict, dict[str, Any], bool]],
    columns: tuple[str, ...],
    hand_over: bool,
    now: datetime,
) -> dict[int, tuple[Any, bool]]:
    targets = {**_PARAMS, **{f"m_{c}": M[c] for c in columns}}
    arrays: dict[str, list[Any]] = {name: [] for name in [*targets, "h_noted"]}
    for run, entered, verdict, values, _ in items:
        params, noted, _ = leases.outcome_params(conn, run, entered, verdict, now, hand_over)
        params.update({f"m_{c}": v for c, v in values.items()})
        arrays["h_noted"].append(noted)
        for name in targets:
            arrays[name].append(params.get(name))
    for name, target in targets.items():  # as SQLAlchemy would bind each value to its column (redaction)
        process = target.type.bind_processor(conn.dialect)
        if process is not None:
            arrays[name] = [None if v is None else process(v) for v in arrays[name]]
    types = tuple(targets[n].type.compile(dialect=conn.dialect) for n in targets)
    rows = {}
    for row in conn.execute(_statement(columns, types), arrays):
        values = dict(row._mapping)
        inserted = values.pop("new_call") is not None
        rows[values["id"]] = (SimpleNamespace(**values), inserted)
    return rows
