"""Waiting on conditions with a deadline (never a bare sleep)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import openhub
from openhub.core.errors import StoreUnavailable
from openhub.core.states import FINAL

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str | Callable[[], str] = "condition",
    interval: float = 0.05,
) -> T:
    """Return the first truthy value of `predicate()`, or fail after `timeout` seconds.

    `what` names the condition in the failure; a callable is asked only then (a worker's log at the timeout,
    not as it was when the wait began)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except StoreUnavailable:  # a restarting database is a condition not met yet
            last = None
        if last:
            return last
        time.sleep(interval)  # polling interval of the wait, not a synchronisation
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what() if callable(what) else what} (last: {last!r})"
    )


def wait_final(message_id: int, timeout: float = 60.0) -> openhub.MessageView:
    """Wait until the message is in a final state and return it."""

    def final() -> openhub.MessageView | None:
        view = openhub.get_message(message_id)
        return view if view.state in FINAL else None

    return wait_for(final, timeout, f"message {message_id} to reach a final state")


def wait_state(message_id: int, state: str, timeout: float = 60.0) -> openhub.MessageView:
    """Wait until the message is in `state`."""

    def reached() -> openhub.MessageView | None:
        view = openhub.get_message(message_id)
        return view if view.state == state else None

    return wait_for(reached, timeout, f"message {message_id} to be {state}")
