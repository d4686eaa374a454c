"""The one retry and timing policy (openhub.core.policy): every due time, lease and pause, as a table."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from unittest import mock

import pytest

from openhub.core import policy
from openhub.core.config import Settings
from openhub.core.model import RetryPolicy, Route, step
from openhub.core.states import Event

NOW = datetime(2026, 11, 25, 12, 0, 0)
S = timedelta(seconds=1)


def _settings() -> Settings:
    env = {
        "OPENHUB_RETRY_INTERVAL": "60",
        "OPENHUB_POSTPONE_INTERVAL": "5",
        "OPENHUB_LEASE_GRACE": "30",
        "OPENHUB_STEP_TIMEOUT": "300",
        "OPENHUB_CONFIRM_INTERVAL": "60",
        "OPENHUB_CONFIRM_TIMEOUT": "30",
        "OPENHUB_MAX_FAILS": "3",
        "OPENHUB_CONFIRM_MAX_FAILS": "4",
    }
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


@pytest.mark.parametrize(
    "event, asked, expected",
    [
        (Event.POSTPONED, None, 5 * S),  # OPENHUB_POSTPONE_INTERVAL
        (Event.POSTPONED, 42 * S, 42 * S),  # Postpone(delay=...)
        (Event.HELD_BACK, 42 * S, 5 * S),  # looks again once its route is resumed
        (Event.WAIT_RESPONSE, None, 300 * S),  # the step timeout is the response timeout
        (Event.WAIT_RESPONSE, 42 * S, 42 * S),  # WaitForResponse(timeout=...)
        (Event.NO_EFFECT, None, 7 * S),  # the step's retry interval, no failure counted
        (Event.TRANSIENT, None, None),  # a failure: retry_due, with the failure counted
        (Event.COMPLETED, None, None),
    ],
)
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


def test_retry_forever_never_fails_and_its_back_off_stops_at_the_cap() -> None:
    from openhub.core.model import RetryPolicy
    from openhub.core.states import Event, State, transition

    forever = RetryPolicy(max_fails=None, interval=timedelta(seconds=1), backoff=2, max_interval=timedelta(seconds=30))
    assert forever.forever and not RetryPolicy().forever
    assert [forever.delay(n).total_seconds() for n in (1, 2, 5, 6, 50, 10_000)] == [1, 2, 16, 30, 30, 30]
    assert transition(State.PROCESSING, Event.TRANSIENT, 10**6, None).state == State.PARTLY_FAILED
    assert policy.retry_due(forever, 10**6, NOW) == NOW + timedelta(seconds=30)


def test_retry_forever_with_a_growing_back_off_needs_its_cap() -> None:
    from openhub.core.errors import ConfigurationError
    from openhub.core.model import RetryPolicy

    with pytest.raises(ConfigurationError, match="needs max_interval"):
        RetryPolicy(max_fails=None, backoff=2)
    with pytest.raises(ConfigurationError, match="int >= 0 or None"):
        RetryPolicy(max_fails=-1)
    assert RetryPolicy(max_fails=None).delay(10**6) == timedelta(seconds=60)  # no growth: no cap needed


def test_a_source_systems_own_confirmation_policy_replaces_the_global_one() -> None:
    from openhub.core.model import RetryPolicy

    settings = Settings.from_env({})
    forever = RetryPolicy(max_fails=None, interval=timedelta(seconds=5), backoff=2, max_interval=timedelta(minutes=1))
    assert policy.confirmation_retry(10**4, NOW, settings, retry=forever) == NOW + timedelta(minutes=1)
    assert policy.confirmation_retry(2, NOW, settings, retry=forever) == NOW + timedelta(seconds=10)
    twice = RetryPolicy(max_fails=2, interval=timedelta(seconds=5))
    assert policy.confirmation_retry(2, NOW, settings, retry=twice) == NOW + timedelta(seconds=5)
    assert policy.confirmation_retry(3, NOW, settings, retry=twice) is None  # its failures exceed max_fails: parked


def test_a_confirmers_retry_policy_is_collected_with_it() -> None:
    from openhub.core.errors import ConfigurationError
    from openhub.core.registry import Registry, confirmation

    forever = RetryPolicy(max_fails=None, interval=timedelta(seconds=5))

    @confirmation("CRM", retry=forever)
    def to_crm(outcome) -> None:
        """A confirmer with its own policy."""

    @confirmation("ERP")
    def to_erp(outcome) -> None:
        """One with the global policy."""

    registry = Registry()
    registry.add_confirmer("CRM", to_crm)
    registry.add_confirmer("ERP", to_erp)
    assert registry.confirm_retries == {"CRM": forever}
    with pytest.raises(ConfigurationError, match="retry must be a RetryPolicy"):
        confirmation("CRM", retry=3)  # type: ignore[arg-type]
