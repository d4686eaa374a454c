"""README.md's states ("How it works") as a table: each row is (state, event, failed_count) ->
(state, failed_count, actions)."""

from __future__ import annotations

from pathlib import Path

import pytest

import openhub
from openhub.core.errors import StateConflict
from openhub.core.states import FINAL, SETTLED_CONFIRMATIONS, Action, ConfirmationState, Event, State, transition

S, E, A = State, Event, Action
FIN = {A.CONFIRM, A.RELEASE_FUNNEL, A.NOTIFY_PARENT}

# max_fails is 3 in every row.
TABLE = [
    # accepted NEW -> IN_QUEUE once its chain is published
    # the chain's first task claims it
    (S.IN_QUEUE, E.CLAIMED, 0, S.PROCESSING, 0, set()),
    (S.NEW, E.CLAIMED, 0, S.PROCESSING, 0, set()),
    # last step ok
    (S.PROCESSING, E.COMPLETED, 1, S.OK, 1, FIN),
    (S.WAITING, E.COMPLETED, 0, S.OK, 0, FIN),  # a split that was the last step: its family is OK
    # transient error: +1, retried; over max_fails: FAILED
    (S.PROCESSING, E.TRANSIENT, 0, S.PARTLY_FAILED, 1, {A.SCHEDULE_RETRY, A.RELEASE_FUNNEL}),
    (S.PROCESSING, E.TRANSIENT, 2, S.PARTLY_FAILED, 3, {A.SCHEDULE_RETRY, A.RELEASE_FUNNEL}),
    (S.PROCESSING, E.TRANSIENT, 3, S.FAILED, 4, FIN),
    # no effect: failed count unchanged
    (S.PROCESSING, E.NO_EFFECT, 2, S.PARTLY_FAILED, 2, {A.SCHEDULE_RETRY, A.RELEASE_FUNNEL}),
    # Reject: FAILED, +1, no retry
    (S.PROCESSING, E.REJECTED, 0, S.FAILED, 1, FIN),
    # Postpone / Holdback
    (S.PROCESSING, E.POSTPONED, 1, S.POSTPONED, 1, {A.RELEASE_FUNNEL}),
    (S.IN_QUEUE, E.POSTPONED, 0, S.POSTPONED, 0, set()),  # refused at claim: it never held its funnel
    (S.NEW, E.POSTPONED, 0, S.POSTPONED, 0, set()),
    (S.PROCESSING, E.HELD_BACK, 0, S.POSTPONED, 0, {A.PAUSE_ROUTE}),
    # obsolete entity message
    (S.PROCESSING, E.OBSOLETE, 1, S.SKIPPED, 1, {A.RELEASE_FUNNEL, A.NOTIFY_PARENT}),
    # split: parent waits; children done -> goes on, or FAILED
    (S.PROCESSING, E.SPLIT, 0, S.WAITING, 0, {A.DISPATCH_CHILDREN}),
    (S.WAITING, E.CHILDREN_OK, 0, S.IN_QUEUE, 0, set()),
    (S.WAITING, E.CHILD_FAILED, 0, S.FAILED, 0, FIN),
    # async response
    (S.PROCESSING, E.WAIT_RESPONSE, 0, S.WAITING_FOR_RES, 0, set()),
    (S.WAITING_FOR_RES, E.RESPONDED, 0, S.IN_QUEUE, 0, set()),
    (S.WAITING_FOR_RES, E.TRANSIENT, 0, S.PARTLY_FAILED, 1, {A.SCHEDULE_RETRY, A.RELEASE_FUNNEL}),
    # worker lost (its run repaired), a fenced run let go, chain lost: the hub's faults, never a failure
    (S.PROCESSING, E.LEASE_EXPIRED, 0, S.PARTLY_FAILED, 0, {A.RELEASE_FUNNEL}),
    (S.PROCESSING, E.LEASE_EXPIRED, 3, S.PARTLY_FAILED, 3, {A.RELEASE_FUNNEL}),  # even at max_fails
    (S.PROCESSING, E.LEASE_DROPPED, 3, S.PARTLY_FAILED, 3, {A.RELEASE_FUNNEL}),
    (S.IN_QUEUE, E.CHAIN_LOST, 3, S.IN_QUEUE, 3, set()),  # a chain that never ran costs no failure
    (S.PROCESSING, E.CHAIN_LOST, 1, S.IN_QUEUE, 1, set()),
    # the poller re-drives
    (S.PARTLY_FAILED, E.REDRIVEN, 2, S.IN_QUEUE, 2, set()),
    (S.POSTPONED, E.REDRIVEN, 0, S.IN_QUEUE, 0, set()),
    (S.NEW, E.REDRIVEN, 0, S.IN_QUEUE, 0, set()),
    # guaranteed order blocked too long
    (S.POSTPONED, E.ORDER_EXPIRED, 0, S.FAILED, 0, FIN),
    # its expiry time passed before a chain took it
    (S.IN_QUEUE, E.EXPIRED, 1, S.FAILED, 1, FIN),
    # operator restart: count reset
    (S.OK, E.RESTARTED, 2, S.PARTLY_FAILED, 0, set()),
    (S.FAILED, E.RESTARTED, 4, S.PARTLY_FAILED, 0, set()),
    (S.CANCEL, E.RESTARTED, 1, S.PARTLY_FAILED, 0, set()),
    # a topic's message: its receivers written with it, it is OK (not confirmed: they are, each)
    (S.NEW, E.FANNED_OUT, 0, S.OK, 0, set()),
    # operator cancel from any non-final state
    *[(s, E.CANCELLED, 1, S.CANCEL, 1, FIN) for s in State if s not in FINAL],
]


@pytest.mark.parametrize(
    "state, event, count, new_state, new_count, actions", TABLE, ids=[f"{r[0]}-{r[1]}-{r[2]}" for r in TABLE]
)
def test_transition(
    state: State, event: Event, count: int, new_state: State, new_count: int, actions: set[Action]
) -> None:
    result = transition(state, event, count, max_fails=3)
    assert (result.state, result.failed_count, set(result.actions)) == (new_state, new_count, actions)


REFUSED = [
    (S.PROCESSING, E.RESTARTED),
    (S.PARTLY_FAILED, E.RESTARTED),
    (S.SKIPPED, E.RESTARTED),
    *[(s, E.CANCELLED) for s in FINAL],
    (S.OK, E.CLAIMED),
    (S.PROCESSING, E.CLAIMED),
    (S.OK, E.COMPLETED),
    (S.IN_QUEUE, E.RESPONDED),
    (S.OK, E.REDRIVEN),
    (S.PROCESSING, E.REDRIVEN),
    (S.WAITING, E.TRANSIENT),
    (S.IN_QUEUE, E.LEASE_EXPIRED),
    (S.PARTLY_FAILED, E.CHAIN_LOST),
    (S.PROCESSING, E.FANNED_OUT),
    (S.OK, E.FANNED_OUT),
]


@pytest.mark.parametrize("state, event", REFUSED, ids=[f"{s}-{e}" for s, e in REFUSED])
def test_refused(state: State, event: Event) -> None:
    with pytest.raises(StateConflict, match=f"not allowed in state {state.value}"):
        transition(state, event)


@pytest.mark.parametrize(
    "lost, new_state, new_count", [(1, S.PARTLY_FAILED, 0), (5, S.PARTLY_FAILED, 0), (6, S.FAILED, 1)]
)
def test_a_step_whose_runs_keep_taking_their_worker_down_ends_failed(
    lost: int, new_state: State, new_count: int
) -> None:
    # `lost`: the runs of its step lost in a row, this one included; OPENHUB_MAX_LOST_RUNS is 5
    result = transition(S.PROCESSING, E.LEASE_EXPIRED, 0, max_fails=3, lost_runs=lost, max_lost_runs=5)
    assert (result.state, result.failed_count) == (new_state, new_count)
    assert set(result.actions) == (FIN if new_state is S.FAILED else {A.RELEASE_FUNNEL})


def test_a_fenced_run_let_go_is_never_counted() -> None:
    result = transition(S.PROCESSING, E.LEASE_DROPPED, 0, lost_runs=100, max_lost_runs=5)
    assert (result.state, result.failed_count) == (S.PARTLY_FAILED, 0)


def test_every_event_has_a_row() -> None:
    assert {row[1] for row in TABLE} == set(Event)


def test_the_live_index_leaves_out_exactly_the_final_states() -> None:
    """schema.py spells FINAL out (it imports no domain code): a state added to FINAL must reach the
    partial index of live messages, and the index must stay the one migration 0006 created."""
    from openhub.store.schema import LIVE_PREDICATE

    assert LIVE_PREDICATE == f"state NOT IN ({', '.join(repr(s.value) for s in sorted(FINAL))})"
    migration = (Path(openhub.__file__).parent / "store/migrations/versions/0006_finished_index.py").read_text()
    assert f'LIVE = "{LIVE_PREDICATE}"' in migration


def test_confirmation_states_settle_in_ok_or_parked() -> None:
    assert SETTLED_CONFIRMATIONS == {ConfirmationState.OK, ConfirmationState.FAILED_END}
    assert [s.value for s in ConfirmationState] == ["PENDING", "SENDING", "OK", "FAILED", "FAILED_END"]
