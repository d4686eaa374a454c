"""When a message, a step or a confirmation is tried again: the hub's one retry and timing policy.

Where is a failed step's retry decided? Here. Every due time the hub gives a message, every lease's
length and every pause before trying again is computed by a function of this module, from the
settings (`OPENHUB_*`, passed in), the route's and step's `RetryPolicy` and the time `now` (passed
in). Nothing here reads the clock, the environment or the store: the modules that write the columns
(engine, lifecycle, the due scan, confirm) ask it and write what it answers. How many failures a message
has had, and which state that leads to, is the state table's part (openhub.core.states).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from openhub.core.config import Settings
from openhub.core.endpoints import ConfirmEndpoint
from openhub.core.model import RetryPolicy, Route, RouteStep
from openhub.core.states import Event

CHAIN_WAIT_MAX = timedelta(hours=1)  # the longest a republished chain is given to reach its first task
UNKNOWN_ROUTE_BACKOFF = timedelta(hours=1)  # a message of a route no worker knows is looked at again after
OUTAGE_BACKOFF_MAX = 5.0  # seconds, at most, between two tries of a write while the store is away


def retry_policy(route: Route | None, item: RouteStep | None, settings: Settings) -> RetryPolicy:
    """The retry policy of a step: its own, else its route's, else the OPENHUB_* defaults."""
    if item is not None and item.retry is not None:
        return item.retry
    if route is not None and route.retry is not None:
        return route.retry
    return RetryPolicy(max_fails=settings.max_fails, interval=settings.retry_interval or timedelta(seconds=1))


def retry_due(policy: RetryPolicy, failed_count: int, now: datetime) -> datetime:
    """When a message that failed for the `failed_count`-th time is tried again."""
    return now + policy.delay(failed_count)


def verdict_due(
    event: Event, delay: timedelta | None, policy: RetryPolicy, now: datetime, settings: Settings
) -> datetime | None:
    """The due time a step's verdict gives its message, for the verdicts that are not failures (a
    TRANSIENT failure's is `retry_due`; a final state has none); `delay` is what the step asked for."""
    if event is Event.POSTPONED:
        return now + (delay or settings.postpone_interval)
    if event is Event.HELD_BACK:  # the route is paused; the message looks again once it is resumed
        return now + settings.postpone_interval
    if event is Event.WAIT_RESPONSE:  # the response timeout: no answer by then fails the step
        return now + (delay or settings.step_timeout)
    if event is Event.NO_EFFECT:  # tried again at the retry interval, no failure counted
        return now + policy.interval
    return None


def postpone_until(now: datetime, settings: Settings) -> datetime:
    """When a message that may not go on now (route paused, funnel busy, system at its limit, an
    earlier run still in flight) looks again; no failure is counted."""
    return now + settings.postpone_interval


def step_timeout(item: RouteStep, settings: Settings) -> timedelta:
    """How long one run of the step may take before it is interrupted."""
    return item.timeout or settings.step_timeout


def lease_until(item: RouteStep, now: datetime, settings: Settings) -> datetime:
    """Until when a step run's lease holds: its timeout, and the grace for recording its outcome."""
    return now + step_timeout(item, settings) + settings.lease_grace


def handover_due(now: datetime, settings: Settings) -> datetime:
    """By when a published chain's next task must have taken the message (OPENHUB_LEASE_GRACE)."""
    return now + settings.lease_grace


def chain_wait(event: Event, waited: timedelta, settings: Settings) -> timedelta:
    """How long a published chain may take to reach its first task before it is published again.

    OPENHUB_LEASE_GRACE, doubled each time the chain was not taken in time (`waited`: since the
    previous chain was published; a backlog that outlasts the grace): every republication adds a
    chain to the queue, and only the newest carries the message.
    """
    grace = settings.lease_grace
    if event is not Event.CHAIN_LOST:
        return grace
    return max(grace, min(2 * waited, max(grace, CHAIN_WAIT_MAX)))


def outage_pause(attempt: int) -> float:
    """Seconds to wait before trying a write again, the `attempt`-th time the store was away:
    doubling from 0.1 s up to OUTAGE_BACKOFF_MAX."""
    return min(0.05 * 2.0 ** min(attempt, 10), OUTAGE_BACKOFF_MAX)


def confirmation_lease(settings: Settings) -> timedelta:
    """How long a confirmation's sender holds it without renewing it: longer than a send may take
    (OPENHUB_CONFIRM_TIMEOUT, twice). It is renewed while the confirmer runs (openhub.confirm), so a slow
    send is never claimed and sent a second time meanwhile; a dead sender's is taken over after it."""
    return max(settings.confirm_interval, settings.step_timeout, 2 * settings.confirm_timeout)


def confirmation_renewal(lease: timedelta) -> float:
    """Seconds between two renewals of a confirmation's sending lease while its confirmer runs: a fifth
    of the lease, so a renewal or two may fail (a slow store) before the lease is near its end."""
    return max(lease.total_seconds() / 5, 0.05)


def confirmation_retry(
    attempts: int,
    now: datetime,
    settings: Settings,
    endpoint: ConfirmEndpoint | None = None,
    retry: RetryPolicy | None = None,
) -> datetime | None:
    """When a confirmation whose `attempts`-th send failed is sent again; None: parked (FAILED_END). Sent by
    the stock confirmation protocol, its source system's `endpoint` (OPENHUB_CONFIRM_ENDPOINTS) may say
    otherwise (its own interval, backoff, max_fails or forever); `retry`: its source system's own policy
    (`@confirmation(..., retry=)`); else the OPENHUB_CONFIRM_* one."""
    if endpoint is not None:
        return endpoint.retry_at(attempts, now, settings.confirm_max_fails, settings.confirm_interval)
    if retry is not None:
        if retry.max_fails is not None and attempts > retry.max_fails:
            return None
        return now + retry.delay(attempts)
    if attempts >= settings.confirm_max_fails:
        return None
    return now + settings.confirm_interval
