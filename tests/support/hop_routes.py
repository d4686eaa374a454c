"""A three-step route for chain mode's round trips per hop (tests/integration/test_chain_round_trips.py): each
step notes its call (`CALLS`: step, message id, attempt); step `two` fails transiently at its first attempt
where the payload says `fail_two`, and its retry comes a second later."""

from __future__ import annotations

from datetime import timedelta

from openhub import RetryPolicy, Route, StepContext, step

CALLS: list[tuple[str, int, int]] = []


@step
def one(ctx: StepContext) -> None:
    CALLS.append(("one", ctx.message.id, ctx.attempt))


@step(retry=RetryPolicy(max_fails=3, interval=timedelta(seconds=1)))
def two(ctx: StepContext) -> None:
    CALLS.append(("two", ctx.message.id, ctx.attempt))
    if ctx.payload.get("fail_two") and ctx.attempt == 1:
        raise RuntimeError("the system answered 503")


@step
def three(ctx: StepContext) -> None:
    CALLS.append(("three", ctx.message.id, ctx.attempt))


routes = [Route("hops.flow", steps=[one, two, three])]
