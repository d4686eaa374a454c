"""Message states and the pure state machine: (state, event) -> (new state, failed count, actions).

This is the life of a message (README.md, "How it works") as a function. Every state a message is given is written by
`openhub.engine.lifecycle.apply_event`, which asks this table first, so the design and the code cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from openhub.core.errors import StateConflict


class State(StrEnum):
    """The states a message goes through (README.md, "How it works")."""

    NEW = "NEW"
    IN_QUEUE = "IN_QUEUE"
    PROCESSING = "PROCESSING"
    WAITING = "WAITING"
    WAITING_FOR_RES = "WAITING_FOR_RES"
    PARTLY_FAILED = "PARTLY_FAILED"
    POSTPONED = "POSTPONED"
    OK = "OK"
    FAILED = "FAILED"
    CANCEL = "CANCEL"
    SKIPPED = "SKIPPED"


FINAL = frozenset({State.OK, State.FAILED, State.CANCEL, State.SKIPPED})
NON_FINAL = frozenset(State) - FINAL
CONFIRMED = frozenset({State.OK, State.FAILED, State.CANCEL})


class Event(StrEnum):
    """What happened to a message."""

    REDRIVEN = "redriven"  # the poller (or a funnel release) published a new chain
    CHAIN_LOST = "chain_lost"  # no step took the chain in time (a backlog, a flushed broker): a new one
    CLAIMED = "claimed"  # the first task of the chain took it
    COMPLETED = "completed"  # the last step succeeded (a last split: every child is OK)
    TRANSIENT = "transient"  # a step failed in a way worth retrying
    NO_EFFECT = "no_effect"  # a step asked to try again later without counting a failure
    REJECTED = "rejected"  # a step refused the message for good
    POSTPONED = "postponed"  # a step postponed it, or its funnel is busy
    HELD_BACK = "held_back"  # a step held it back and paused the route
    OBSOLETE = "obsolete"  # a newer message for the same entity is already done
    SPLIT = "split"  # children were written; the parent waits for them
    CHILDREN_OK = "children_ok"  # every child is OK: the parent goes on with the steps after the split
    CHILD_FAILED = "child_failed"  # a child ended FAILED
    WAIT_RESPONSE = "wait_response"  # a step parked the message until a response arrives
    RESPONDED = "responded"  # the awaited response arrived
    LEASE_EXPIRED = "lease_expired"  # its step's run ended without an outcome (worker lost, task crashed)
    LEASE_DROPPED = "lease_dropped"  # a worker fenced off (heartbeat behind) let its step's lease go uncalled
    ORDER_EXPIRED = "order_expired"  # blocked in its guaranteed-order funnel past the limit
    EXPIRED = "expired"  # its expiry time passed before a chain took it
    RESTARTED = "restarted"  # an operator restarted a final message
    CANCELLED = "cancelled"  # an operator cancelled a non-final message
    FANNED_OUT = "fanned_out"  # a topic's message: its receivers were written with it (openhub.core.topics)


class Note(StrEnum):
    """History entries that are not state changes (the `event` column beside the `Event`s)."""

    ACCEPTED = "accepted"  # the message was stored (NEW)
    STEP_OK = "step_ok"  # a step's call succeeded (or was sent, for a wait)
    RESPONSE_EARLY = "response_early"  # a response came while the step that waits for it still ran
    RESPONSE_DUPLICATE = "response_duplicate"  # a second answer for an answered wait (same token): not kept
    RESPONSE_REFUSED = "response_refused"  # an answer for no open wait, or without the token it needed
    TASK_CRASHED = "task_crashed"  # a task carrying the message crashed outside its step
    CALLS_CLEARED = "calls_cleared"  # an operator's restart from a step cleared that step's and later call records
    RETRY_NOW = "retry_now"  # an operator made a waiting retry due now
    PAYLOAD_EDITED = "payload_edited"  # an operator replaced a FAILED message's payload (the old one in the detail)


class CallState(StrEnum):
    """The states of an external-call record (`ext_calls.state`)."""

    PROCESSING = "PROCESSING"  # a step run is calling (or was, when it died)
    OK = "OK"  # the call succeeded: never made again for this key
    WAITING = "WAITING"  # sent; the answer comes back through openhub.respond()
    FAILED = "FAILED"  # the attempt failed; the next attempt calls again
    NO_EFFECT = "NO_EFFECT"  # the step said it had no effect; tried again later
    POSTPONED = "POSTPONED"  # the step postponed itself or held its route back


class ConfirmationState(StrEnum):
    """The states of a confirmation or state-hook notification (`confirmations.state`)."""

    PENDING = "PENDING"  # written with the final state; not sent yet
    SENDING = "SENDING"  # claimed by a sender (compare-and-set), the send in flight
    OK = "OK"  # the receiver took it: never sent again
    FAILED = "FAILED"  # the last attempt failed; the poller sends it again when due
    FAILED_END = "FAILED_END"  # parked: its attempts ran out, until an operator resends it


SETTLED_CONFIRMATIONS = frozenset({ConfirmationState.OK, ConfirmationState.FAILED_END})


class Action(StrEnum):
    """Side effects the caller must carry out after committing the transition."""

    CONFIRM = "confirm"  # queue the confirmation to the source system
    SCHEDULE_RETRY = "schedule_retry"  # next attempt after the retry policy's delay
    PAUSE_ROUTE = "pause_route"  # the route stops until an operator resumes it
    RELEASE_FUNNEL = "release_funnel"  # dispatch the next postponed message of the funnel now
    NOTIFY_PARENT = "notify_parent"  # a child reached a final state: re-check the parent
    DISPATCH_CHILDREN = "dispatch_children"  # publish the chains of the children just written


@dataclass(frozen=True)
class Transition:
    """The outcome of applying an event: the new state, failed count and actions to carry out."""

    state: State
    failed_count: int
    actions: frozenset[Action] = frozenset()


def _failure(failed_count: int, max_fails: int | None) -> Transition:
    count = failed_count + 1
    if max_fails is not None and count > max_fails:  # None: retried for ever
        return Transition(State.FAILED, count, frozenset({Action.CONFIRM}))
    return Transition(State.PARTLY_FAILED, count, frozenset({Action.SCHEDULE_RETRY}))


_ALLOWED: dict[Event, frozenset[State]] = {
    Event.REDRIVEN: frozenset({State.NEW, State.PARTLY_FAILED, State.POSTPONED}),
    Event.CLAIMED: frozenset({State.NEW, State.IN_QUEUE}),
    Event.COMPLETED: frozenset({State.PROCESSING, State.WAITING}),  # WAITING: its split was the last step
    Event.TRANSIENT: frozenset({State.PROCESSING, State.WAITING_FOR_RES}),
    Event.NO_EFFECT: frozenset({State.PROCESSING}),
    Event.REJECTED: frozenset({State.PROCESSING}),
    Event.POSTPONED: frozenset({State.NEW, State.IN_QUEUE, State.PROCESSING}),  # route paused, funnel busy
    Event.HELD_BACK: frozenset({State.PROCESSING}),
    Event.OBSOLETE: frozenset({State.PROCESSING}),
    Event.SPLIT: frozenset({State.PROCESSING}),
    Event.CHILDREN_OK: frozenset({State.WAITING}),
    Event.CHILD_FAILED: frozenset({State.WAITING}),
    Event.WAIT_RESPONSE: frozenset({State.PROCESSING}),
    Event.RESPONDED: frozenset({State.WAITING_FOR_RES}),
    Event.CHAIN_LOST: frozenset({State.IN_QUEUE, State.PROCESSING}),
    Event.LEASE_EXPIRED: frozenset({State.PROCESSING}),
    Event.LEASE_DROPPED: frozenset({State.PROCESSING}),
    Event.ORDER_EXPIRED: frozenset({State.POSTPONED, State.NEW, State.IN_QUEUE, State.PARTLY_FAILED}),
    Event.EXPIRED: frozenset({State.NEW, State.IN_QUEUE}),  # at claim: every start and retry passes there
    Event.RESTARTED: frozenset({State.OK, State.FAILED, State.CANCEL}),
    Event.CANCELLED: NON_FINAL,
    Event.FANNED_OUT: frozenset({State.NEW}),
}

_FINISHED = frozenset({Action.CONFIRM, Action.RELEASE_FUNNEL, Action.NOTIFY_PARENT})


def allowed(state: State, event: Event) -> bool:
    """Whether `event` may happen to a message in `state`."""
    return state in _ALLOWED[event]


def transition(
    state: State | str,
    event: Event,
    failed_count: int = 0,
    max_fails: int | None = 3,
    *,
    lost_runs: int = 0,
    max_lost_runs: int = 5,
) -> Transition:
    """Apply `event` to a message in `state`; raise StateConflict where §3 does not allow it.

    `lost_runs`: for LEASE_EXPIRED, how many runs of the message's step in a row ended without an
    outcome, this one included (the poison-message guard, OPENHUB_MAX_LOST_RUNS)."""
    state = State(state)
    if state not in _ALLOWED[event]:
        raise StateConflict(f"{event.value} is not allowed in state {state.value}")
    same = failed_count
    if event in (Event.REDRIVEN, Event.RESPONDED, Event.CHAIN_LOST):
        return Transition(State.IN_QUEUE, same)
    if event is Event.CLAIMED:
        return Transition(State.PROCESSING, same)
    if event is Event.COMPLETED:
        return Transition(State.OK, same, _FINISHED)
    if event in (Event.LEASE_EXPIRED, Event.LEASE_DROPPED):
        # A fault of the hub's own (a worker lost, a store away, a fence) is never one of the message's
        # failures; but a step whose every run takes its worker down with it must not loop for ever.
        if event is Event.LEASE_EXPIRED and lost_runs > max_lost_runs:
            return Transition(State.FAILED, failed_count + 1, _FINISHED)
        return Transition(State.PARTLY_FAILED, same, frozenset({Action.RELEASE_FUNNEL}))
    if event is Event.TRANSIENT:
        result = _failure(failed_count, max_fails)
        if result.state is State.FAILED:
            return Transition(result.state, result.failed_count, _FINISHED)
        return Transition(result.state, result.failed_count, result.actions | {Action.RELEASE_FUNNEL})
    if event is Event.NO_EFFECT:
        return Transition(State.PARTLY_FAILED, same, frozenset({Action.SCHEDULE_RETRY, Action.RELEASE_FUNNEL}))
    if event in (Event.REJECTED, Event.CHILD_FAILED):
        return Transition(State.FAILED, failed_count + (event is Event.REJECTED), _FINISHED)
    if event in (Event.ORDER_EXPIRED, Event.EXPIRED):
        return Transition(State.FAILED, same, _FINISHED)
    if event is Event.POSTPONED:  # only a running message held its funnel; one refused at claim never did
        released = frozenset({Action.RELEASE_FUNNEL}) if state is State.PROCESSING else frozenset()
        return Transition(State.POSTPONED, same, released)
    if event is Event.HELD_BACK:
        return Transition(State.POSTPONED, same, frozenset({Action.PAUSE_ROUTE}))
    if event is Event.OBSOLETE:
        return Transition(State.SKIPPED, same, frozenset({Action.RELEASE_FUNNEL, Action.NOTIFY_PARENT}))
    if event is Event.SPLIT:
        return Transition(State.WAITING, same, frozenset({Action.DISPATCH_CHILDREN}))
    if event is Event.CHILDREN_OK:
        return Transition(State.IN_QUEUE, same)
    if event is Event.WAIT_RESPONSE:
        return Transition(State.WAITING_FOR_RES, same)
    if event is Event.RESTARTED:
        return Transition(State.PARTLY_FAILED, 0)
    if event is Event.CANCELLED:
        return Transition(State.CANCEL, same, _FINISHED)
    if event is Event.FANNED_OUT:  # its receivers carry the work, and are confirmed each
        return Transition(State.OK, same)
    raise AssertionError(f"unhandled event {event}")  # pragma: no cover
