"""Routes for two hosts whose clocks are 150 s apart (tests/integration/test_one_clock.py).

Host "behind" serves Celery's default queue (and runs beat, so the poller's ticks); host "ahead" serves
the queue `ahead`. Each timed behaviour is arranged so that a time written on one host is compared on
the other: where a route's steps run is its queue. Every step posts to `{prefix}/{step}` of the test's
external system, as the behaviour suite's do (tests/support/routes.py).
"""

from __future__ import annotations

from datetime import timedelta

from openhub import Outcome, RetryPolicy, Route, StepContext, confirmation, step
from tests.support.routes import call, external_url

AHEAD = "ahead"  # the queue of the host whose clock is ahead
SECONDS = 5  # every timed behaviour below lasts this long
QUICK = RetryPolicy(max_fails=1000, interval=timedelta(seconds=0.2))  # retried at once, for as long as the test
PATIENT = RetryPolicy(max_fails=100, interval=timedelta(seconds=1))  # retried once the breaker has opened


@step
def ordered(ctx: StepContext) -> None:
    """A member of a guaranteed-order funnel."""
    call(ctx, "ordered")


@step
def stale(ctx: StepContext) -> None:
    """The call of a message that expires before it is made."""
    call(ctx, "stale")


@step(retry=RetryPolicy(max_fails=3, interval=timedelta(seconds=SECONDS)))
def retried(ctx: StepContext) -> None:
    """A call retried after the step's interval."""
    call(ctx, "retried")


@step
def asks(ctx: StepContext) -> None:
    """A question whose answer does not come in time."""
    call(ctx, "asks")
    ctx.wait_for_response(timedelta(seconds=SECONDS))


@step(key="paced", system="clock-paced")  # OPENHUB_SYSTEM_RATES: two calls a second
def paced(ctx: StepContext) -> None:
    """A call of a system with a rate."""
    call(ctx, "paced")


@step(key="post", system="clock-post")  # OPENHUB_SYSTEM_LIMITS: one call in flight
def post(ctx: StepContext) -> None:
    """A call of a system with a limit of calls in flight."""
    call(ctx, "post")


@step(key="bill", system="clock-billing")  # its circuit breaker opens after OPENHUB_BREAKER_FAILURES
def bill(ctx: StepContext) -> None:
    """A call of a system whose breaker opens."""
    call(ctx, "bill")


routes = [
    Route(
        "clock.ordered",
        steps=[ordered],
        funnel=lambda p: p["group"],
        guaranteed_order=True,
        order_timeout=timedelta(seconds=SECONDS),
        retry=QUICK,
        queue=AHEAD,
    ),
    Route("clock.expiring", steps=[stale], expires_after=timedelta(seconds=SECONDS), retry=QUICK, queue=AHEAD),
    Route("clock.retried", steps=[retried], queue=AHEAD),
    Route("clock.asks", steps=[asks], retry=QUICK, queue=AHEAD),
    Route("clock.paced_behind", steps=[paced]),
    Route("clock.paced_ahead", steps=[paced], queue=AHEAD),
    Route("clock.post_behind", steps=[post], retry=QUICK),
    Route("clock.post_ahead", steps=[post], retry=QUICK, queue=AHEAD),
    Route("clock.bill_behind", steps=[bill], retry=PATIENT),
    Route("clock.bill_ahead", steps=[bill], retry=PATIENT, queue=AHEAD),
]


@confirmation("CLOCK")
def confirm(outcome: Outcome) -> None:
    """Confirm to the external system, failing when it fails (retried every OPENHUB_CONFIRM_INTERVAL)."""
    import httpx

    prefix = outcome.message.payload["prefix"]
    httpx.post(
        f"{external_url()}{prefix}/confirm",
        json=outcome.as_dict(),
        headers={"Idempotency-Key": f"{outcome.message.id}:{outcome.state}"},
        timeout=10,
    ).raise_for_status()
