"""Routes of the stock confirmation protocol's test (tests/integration/test_confirmation_protocol.py): one
that ends OK, one that ends FAILED, and a source system whose own @confirmation overrides its endpoint."""

from __future__ import annotations

import os

import httpx

from openhub import Outcome, Reject, Route, StepContext, confirmation, step


@step
def done(ctx: StepContext) -> None:
    """Ends the message OK (with a business error, which the confirmation carries)."""
    ctx.business_error("W1", "noted on the way")


@step
def refused(ctx: StepContext) -> None:
    """Ends the message FAILED at once."""
    raise Reject("refused by the test")


routes = [
    Route("proto.ok", steps=[done], errors={"W1": "a business error noted on the way"}),
    Route("proto.fail", steps=[refused]),
]


@confirmation("OWN")
def own(outcome: Outcome) -> None:
    """OWN has an endpoint too: this function overrides it."""
    httpx.post(f"{os.environ['OPENHUB_TEST_RECEIVER_URL']}/own", json=outcome.as_dict(), timeout=10).raise_for_status()
