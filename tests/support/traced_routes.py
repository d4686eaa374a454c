"""A route of three HTTP steps and a confirmation, all through an `openhub.testing.ExternalSystem`
(tests/integration/test_tracing.py): every external call of a message's life, to follow in its trace."""

from __future__ import annotations

import os

from openhub import Child, Outcome, Route, Split, StepContext, confirmation, step
from openhub.outbound.http import HttpCall, pooled_client

system = HttpCall(timeout=5)


def server() -> str:
    """The test's external system (read per call: each test starts its own)."""
    return os.environ["OPENHUB_TEST_HTTP_URL"]


@step
def reserve(ctx: StepContext) -> None:
    """Reserve the goods."""
    system.post(ctx, f"{server()}/reserve", json=ctx.payload)


@step
def charge(ctx: StepContext) -> None:
    """Charge the customer (the test makes its first call fail, so it is retried)."""
    system.post(ctx, f"{server()}/charge", json=ctx.payload)


@step
def ship(ctx: StepContext) -> None:
    """Ship the order."""
    system.post(ctx, f"{server()}/ship", json=ctx.payload)


@confirmation("SHOP")
def confirm_shop(outcome: Outcome) -> None:
    """Tell the shop how its order ended."""
    pooled_client().post(f"{server()}/confirm", json=outcome.as_dict(), timeout=5).raise_for_status()


def lines(ctx: StepContext) -> list[Child]:
    """One child per line of the order."""
    return [Child("trace.line", payload=line) for line in ctx.payload["lines"]]


@step
def book_line(ctx: StepContext) -> None:
    """Book one line."""
    system.post(ctx, f"{server()}/line", json=ctx.payload)


routes = [
    Route("trace.order", steps=[reserve, charge, ship]),
    Route("trace.batch", steps=[ship], batch=10),
    Route("trace.lines", steps=[Split(lines, key="lines")]),
    Route("trace.line", steps=[book_line]),
]
