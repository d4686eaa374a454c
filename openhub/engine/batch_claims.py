"""A batch's messages claimed at their route's first step in one statement for the whole group (PostgreSQL;
openhub.engine.batch).

`entry.enter` claims one message at the route's first step in four statements: the row locked, the route's
pauses read, the CLAIMED transition written with its history entry, the step's first call record inserted.
`claim_all` does the same for every member of a batch in ONE statement: the rows locked in message-id order
(two batches never lock crosswise), the claim written with the same compare-and-set per member, the CLAIMED
history entries and the first call records as data-modifying CTEs joined to the rows it wrote.

The statement claims only a message that `entry.enter` would claim without asking admission anything
more: this chain's token, NEW or IN_QUEUE, no earlier run in flight, not expired, in no funnel, its first
attempt (a retry reads its call records to name the step it resumes at), its route not paused nor the hub
draining. Any other member comes back without a row, and the batch enters it alone (`entry.enter`, which
finds out why under its row lock: a stale chain, a refusal), as every member on SQLite.

Counted on a batch of 20 messages x 3 steps (bench/batch_statements.py): the first step's claims took 80
statements (4 per member), now 1.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Integer, String, bindparam, column, text

from openhub.core.runs import StepRun
from openhub.core.states import CallState, Event, State
from openhub.core.verdicts import message_call_key
from openhub.engine.leases import folds_call, lease
from openhub.engine.lifecycle import Tx
from openhub.store.queries import DRAIN
from openhub.store.schema import messages
from openhub.store.workers import current_node

__all__ = ["claim_all"]

M = messages.c

# The compare-and-set of each member's claim: what `entry.enter` would claim without asking admission more.
_CLAIMABLE = f"""messages.id = v.mid
        AND messages.attempt_id = v.token AND messages.state IN ('{State.NEW.value}', '{State.IN_QUEUE.value}')
        AND messages.step_run IS NULL AND (messages.expires_at IS NULL OR messages.expires_at > :now)
        AND messages.funnel IS NULL AND messages.attempts = 0
        AND NOT EXISTS (SELECT 1 FROM route_pauses WHERE route_pauses.route IN (:route, '{DRAIN}')
            AND route_pauses.intake_only IS NOT TRUE)"""


@cache
def _statement(first_call: bool) -> Any:
    # `first_call`: the step's first call record is inserted too (as `leases.take` folds it).
    new_call = f"""
new_call AS (
    INSERT INTO ext_calls (key, message_id, step_key, scope, state, msg_timestamp, attempts, created_at,
        updated_at, worker)
    SELECT v.n_key, keep.id, :step, 'message', '{CallState.PROCESSING.value}', keep.msg_timestamp, 1, :now, :now,
        :node
    FROM v JOIN keep ON keep.id = v.mid
    ON CONFLICT (key) DO NOTHING
    RETURNING id, message_id
)"""
    sql = f"""
WITH v AS (SELECT * FROM unnest(CAST(:mid AS INTEGER[]), CAST(:token AS VARCHAR[]), CAST(:run AS VARCHAR[]),
    CAST(:n_key AS VARCHAR[])) AS v(mid, token, run, n_key)),
locked AS (
    SELECT messages.id, messages.state FROM messages JOIN v ON messages.id = v.mid
    WHERE {_CLAIMABLE}
    ORDER BY messages.id FOR NO KEY UPDATE OF messages
),
keep AS (
    UPDATE messages SET state = '{State.PROCESSING.value}', attempts = messages.attempts + 1,
        started_at = COALESCE(messages.started_at, :now), blocked_since = NULL, step_run = v.run,
        worker = :holder, due_at = :lease_until, updated_at = :now
    FROM locked JOIN v ON v.mid = locked.id
    WHERE messages.id = locked.id AND {_CLAIMABLE}
    RETURNING messages.*, locked.state AS was
),
history AS (
    INSERT INTO transitions (message_id, at, event, from_state, to_state, step_key)
    SELECT keep.id, :now, '{Event.CLAIMED.value}', keep.was, '{State.PROCESSING.value}', :step FROM keep
){"," + new_call if first_call else ""}
SELECT keep.*, {"new_call.id" if first_call else "NULL"} AS new_call
FROM keep{" LEFT JOIN new_call ON new_call.message_id = keep.id" if first_call else ""}
"""
    stamp = M.updated_at.type
    return (
        text(sql)
        .bindparams(
            bindparam("now", type_=stamp),
            bindparam("lease_until", type_=stamp),
            bindparam("route", type_=String()),
            bindparam("step", type_=String()),
            bindparam("holder", type_=String()),
            *([bindparam("node", type_=String())] if first_call else []),
        )
        .columns(*messages.c, column("was", String), column("new_call", Integer))
    )


def claim_all(tx: Tx, runs: list[tuple[StepRun, str]]) -> list[tuple[Any, bool]]:
    """Claim each (step run, run id) of `runs`, the first steps of one route's messages, as `entry.enter`
    would where admission has nothing to ask (the module's docstring): per run, in order, its message row as
    claimed (None where it was not) and whether its step's first call record was inserted. None for every
    run where the new state has hooks (`entry.enter` writes their rows)."""
    members = [(run.message_id, run.token, run_id) for run, run_id in runs]
    route, item = runs[0][0].route.name, runs[0][0].item
    if tx.hub.registry.hooks_for(State.PROCESSING.value):
        return [(None, False)] * len(members)
    first_call = folds_call(tx.conn, item)
    columns = lease(item, "", tx.now, tx.hub.settings)
    params: dict[str, Any] = {
        "mid": [mid for mid, _, _ in members],
        "token": [token for _, token, _ in members],
        "run": [run for _, _, run in members],
        "n_key": [message_call_key(mid, item) for mid, _, _ in members],
        "now": tx.now,
        "lease_until": columns["due_at"],
        "holder": columns["worker"],
        "route": route,
        "step": item.key,
        **({"node": current_node()} if first_call else {}),
    }
    rows: dict[int, tuple[Any, bool]] = {}
    for row in tx.conn.execute(_statement(first_call), params):
        values = dict(row._mapping)
        del values["was"]
        inserted = values.pop("new_call") is not None
        rows[values["id"]] = (SimpleNamespace(**values), inserted)
    return [rows.get(mid, (None, False)) for mid, _, _ in members]
