"""A route whose step computes without yielding (issue 33, break 5): under gevent nothing else of its
process runs meanwhile but OS threads (the heartbeat's)."""

from __future__ import annotations

import time

from openhub import Route, StepContext, step
from tests.support.routes import call


@step
def compute(ctx: StepContext) -> None:
    """Compute for `seconds` of wall-clock time (no I/O, no gevent switch), then call the external system."""
    end = time.monotonic() + float(ctx.payload["seconds"])
    while time.monotonic() < end:
        sum(range(1000))
    call(ctx, "computed")


routes = [Route("cpu.compute", steps=[compute])]
