"""The one retry and timing policy (openhub.policy): every due time, lease and pause, as a table."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from unittest import mock

import pytest

from openhub import policy
from openhub.config import Settings
from openhub.model import RetryPolicy, Route, step
from openhub.states import Event

NOW = datetime(2026, 11, 25, 12, 0, 0)
S = timedelta(seconds=1)


def _settings() -> Settings:
    env = {"OPENHUB_RETRY_INTERVAL": "60", "OPENHUB_POSTPONE_INTERVAL": "5", "OPENHUB_LEASE_GRACE": "30",
           "OPENHUB_STEP_TIMEOUT": "300", "OPENHUB_CONFIRM_INTERVAL": "60", "OPENHUB_CONFIRM_TIMEOUT": "30",
           "OPENHUB_MAX_FAILS": "3", "OPENHUB_CONFIRM_MAX_FAILS": "4"}
    with mock.patch.dict(os.environ, env):
        return Settings.from_env()


def _noop(ctx: object) -> None:
    return None


def test_a_steps_own_policy_wins_over_its_routes_and_the_defaults() -> None:
    settings = _settings()
    own, routes = RetryPolicy(max_fails=9, interval=7 * S), RetryPolicy(max_fails=2, interval=11 * S)
    route = Route("svc.op", [step(retry=own)(_noop), step(key="other")(_noop)], retry=routes)
    assert policy.retry_policy(route, route.steps[0], settings) is own
    assert policy.retry_policy(route, route.steps[1], settings) is routes
    default = policy.retry_policy(None, None, settings)
    assert (default.max_fails, default.interval) == (3, 60 * S)


def test_retries_back_off_as_the_policy_says() -> None:
    backoff = RetryPolicy(max_fails=5, interval=10 * S, backoff=2, max_interval=30 * S)
    assert [policy.retry_due(backoff, n, NOW) - NOW for n in (1, 2, 3, 4)] == [10 * S, 20 * S, 30 * S, 30 * S]


@pytest.mark.parametrize("event, asked, expected", [
    (Event.POSTPONED, None, 5 * S),          # OPENHUB_POSTPONE_INTERVAL
    (Event.POSTPONED, 42 * S, 42 * S),       # Postpone(delay=...)
    (Event.HELD_BACK, 42 * S, 5 * S),        # looks again once its route is resumed
    (Event.WAIT_RESPONSE, None, 300 * S),    # the step timeout is the response timeout
    (Event.WAIT_RESPONSE, 42 * S, 42 * S),   # WaitForResponse(timeout=...)
    (Event.NO_EFFECT, None, 7 * S),          # the step's retry interval, no failure counted
    (Event.TRANSIENT, None, None),           # a failure: retry_due, with the failure counted
    (Event.COMPLETED, None, None),
])
def test_the_due_time_of_each_verdict(event: Event, asked: timedelta | None, expected: timedelta | None) -> None:
    due = policy.verdict_due(event, asked, RetryPolicy(max_fails=3, interval=7 * S), NOW, _settings())
    assert (due - NOW if due else None) == expected


def test_leases_and_handovers() -> None:
    settings = _settings()
    quick = step(timeout=timedelta(seconds=2))(_noop)
    assert policy.step_timeout(quick, settings) == 2 * S
    assert policy.step_timeout(step(_noop), settings) == 300 * S
    assert policy.lease_until(quick, NOW, settings) == NOW + 32 * S  # the timeout and the grace
    assert policy.handover_due(NOW, settings) == NOW + 30 * S
    assert policy.postpone_until(NOW, settings) == NOW + 5 * S


def test_a_lost_chain_waits_twice_as_long_each_time_up_to_an_hour() -> None:
    settings = _settings()
    assert policy.chain_wait(Event.REDRIVEN, 500 * S, settings) == 30 * S
    assert policy.chain_wait(Event.CHAIN_LOST, 10 * S, settings) == 30 * S  # never below the grace
    assert policy.chain_wait(Event.CHAIN_LOST, 100 * S, settings) == 200 * S
    assert policy.chain_wait(Event.CHAIN_LOST, timedelta(hours=3), settings) == policy.CHAIN_WAIT_MAX


def test_store_outage_pauses_double_up_to_a_cap() -> None:
    assert [policy.outage_pause(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert policy.outage_pause(50) == policy.OUTAGE_BACKOFF_MAX


def test_confirmations_are_retried_then_parked() -> None:
    settings = _settings()
    assert [policy.confirmation_retry(n, NOW, settings) for n in (1, 3)] == [NOW + 60 * S] * 2
    assert policy.confirmation_retry(4, NOW, settings) is None  # parked: FAILED_END
    assert policy.confirmation_lease(settings) == 300 * S  # at least a step's timeout
