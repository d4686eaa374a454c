"""Routes of the delivery-semantics tests (issue 37): retry for ever, unbound children, fan-out."""

from __future__ import annotations

from datetime import timedelta

from openhub import Child, Postpone, Reject, RetryPolicy, Route, Split, StepContext, Topic, step
from tests.support.routes import call

# Tiny intervals, doubling to a cap: fifty failures take seconds, and the cap is what most of them wait.
FOREVER = RetryPolicy(max_fails=None, interval=timedelta(seconds=0.01), backoff=2, max_interval=timedelta(seconds=0.05))


@step(retry=FOREVER)
def forever(ctx: StepContext) -> None:
    """Fails as long as the external system does; never FAILED for it."""
    call(ctx, "forever")


def independent(ctx: StepContext) -> list[Child]:
    """One child per entry of `children`: "fail" (Reject), "wait" (postponed for a minute) or "ok"."""
    return [
        Child("dlv.child", payload={"prefix": ctx.payload["prefix"], "does": does, "n": n})
        for n, does in enumerate(ctx.payload["children"])
    ]


@step
def before(ctx: StepContext) -> None:
    """The parent's step before its unbound split."""
    call(ctx, "before")


@step
def after(ctx: StepContext) -> None:
    """The parent's step after its unbound split: runs whatever its children do."""
    call(ctx, "after")


@step
def child(ctx: StepContext) -> None:
    """An unbound child: does what its payload says."""
    call(ctx, f"child{ctx.payload['n']}")
    if ctx.payload["does"] == "fail":
        raise Reject("the child is refused")
    if ctx.payload["does"] == "wait":
        raise Postpone(timedelta(minutes=1))


@step
def receive(ctx: StepContext) -> None:
    """A receiver of topic dlv.published: calls `<prefix>/<its operation>`; postponed for a minute where the
    payload's `wait` names its operation."""
    if ctx.payload.get("wait") == ctx.message.operation:
        raise Postpone(timedelta(minutes=1))
    call(ctx, ctx.message.operation)


RECEIVERS = ("dlvsub.billing", "dlvsub.crm", "dlvsub.warehouse")  # a family's receivers, in order (by name)

routes = [
    Route("dlv.forever", steps=[forever]),
    Route("dlv.unbound", steps=[before, Split(independent, route="dlv.child", bound=False), after]),
    Route("dlv.child", steps=[child]),
    Route("dlv.capped", steps=[before], backlog_limit=3),
    Topic("dlv.published"),
    *(Route(name, steps=[receive], subscribes="dlv.published") for name in RECEIVERS),
]
