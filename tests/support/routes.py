"""Routes the behaviour suite runs, steered by the payload and by the external system's plans.

Every test passes a unique `prefix`, so its calls land on its own paths of the external
system (`{prefix}/{step}`), where it can inject failures and count effects in isolation.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import httpx

from openhub import (
    Child,
    Holdback,
    Outcome,
    Postpone,
    Reject,
    RetryPolicy,
    Route,
    Soap,
    Split,
    StepContext,
    confirmation,
    step,
)
from openhub.outbound.http import HttpCall


def external_url() -> str:
    """The test's external system (read per call: a test process may start several)."""
    return os.environ.get("OPENHUB_TEST_EXTERNAL_URL", "http://127.0.0.1:9")


def call(ctx: StepContext, name: str, body: dict | None = None, began: float | None = None) -> dict:
    """POST the payload (or `body`) to the test's path for this step, with the step's idempotency key (and,
    from a test's worker process, `X-Test-Worker`: which worker made the call; `X-Test-Pid`: which process, for the
    multi-host checker, tests/support/history.py; `X-Test-Began`: the monotonic time the step's body began,
    `began`, or now; `X-Test-Passed`: the monotonic time it passed the fence)."""
    headers = {
        "Idempotency-Key": ctx.idempotency_key,
        "X-Test-Pid": str(os.getpid()),
        "X-Test-Began": f"{time.monotonic() if began is None else began:.6f}",
        "X-Test-Redelivered": str(ctx.redelivered),
    }
    ctx.check_fence()  # a step calling with its own client fences its call itself (README)
    headers["X-Test-Passed"] = f"{time.monotonic():.6f}"  # when it passed the fence (the process model's check)
    if os.environ.get("OPENHUB_TEST_WORKER"):
        headers["X-Test-Worker"] = os.environ["OPENHUB_TEST_WORKER"]
    funnel = ctx.payload.get("funnel_header")
    if funnel:
        headers["X-Funnel"] = funnel
    r = httpx.post(
        f"{external_url()}{ctx.payload['prefix']}/{name}",
        json=ctx.payload if body is None else body,
        headers=headers,
        timeout=30,
    )
    r.raise_for_status()
    return r.json() or {}


def scripted(name: str):
    """A step that calls the external system, then does what the payload scripts for it."""

    def run(ctx: StepContext) -> None:
        began = time.monotonic()
        script = ctx.payload.get("script", {}).get(name, {})
        done = ctx.custom_data.setdefault("done", [])
        if script.get("no_effect_once") and f"{name}:no_effect" not in done:
            done.append(f"{name}:no_effect")
            ctx.custom_data["done"] = done
            ctx.no_effect()
        if script.get("postpone_once") and f"{name}:postponed" not in done:
            done.append(f"{name}:postponed")
            raise Postpone(timedelta(seconds=script.get("postpone_for", 0.2)))
        if script.get("holdback_once") and f"{name}:held" not in done:
            done.append(f"{name}:held")
            raise Holdback("downstream asked us to stop")
        if script.get("pause"):  # the step computes this long between its lease and its call
            time.sleep(script["pause"])
        call(ctx, name, began=began)
        if script.get("business_error"):
            ctx.business_error(script["business_error"], f"{name} refused part of it")
        if script.get("reject"):
            raise Reject(f"{name} refuses this message", code="E400")
        ctx.custom_data[f"{name}_attempt"] = ctx.attempt
        ctx.custom_data["steps"] = ctx.custom_data.get("steps", 0) + 1

    run.__name__ = name
    return step(run)


step_a, step_b, step_c = scripted("a"), scripted("b"), scripted("c")


@step(key="sync", scope="entity")
def sync_entity(ctx: StepContext) -> None:
    """Entity-scope call: once per entity version."""
    call(ctx, "sync")


@step(scope="custom", custom_key=lambda ctx: ctx.payload["account"])
def charge(ctx: StepContext) -> None:
    """Custom-scope call keyed by the account."""
    call(ctx, "charge")


@step(retry=RetryPolicy(max_fails=2, interval=timedelta(seconds=0.2)))
def fragile(ctx: StepContext) -> None:
    """Fails as the external system says; FAILED after the third failure (max_fails=2)."""
    call(ctx, "fragile")


@step(timeout=timedelta(seconds=2))
def slow(ctx: StepContext) -> None:
    """A call the external system may keep waiting past the step's timeout."""
    call(ctx, "slow")


@step(timeout=timedelta(seconds=30))
def patient(ctx: StepContext) -> None:
    """A call that may take longer than a dead worker takes to be noticed, on a live worker."""
    call(ctx, "patient")


pooled_call = HttpCall(timeout=30)


@step(timeout=timedelta(seconds=30))
def pooled(ctx: StepContext) -> None:
    """The patient call through HttpCall, on the process's shared connection pool."""
    pooled_call.post(ctx, f"{external_url()}{ctx.payload['prefix']}/pooled", json=ctx.payload)


@step
def wait_answer(ctx: StepContext) -> None:
    """Give the responder the URL its answer goes to (it carries this ask's token), send the request and
    park until the answer is posted back. The URL is the API's as the tests' client reaches it."""
    call(ctx, "callback", {"url": ctx.response_url("http://testserver")})
    call(ctx, "request")
    ctx.wait_for_response(timedelta(seconds=float(ctx.payload.get("wait", 30))))


@step
def use_answer(ctx: StepContext) -> None:
    """The step after the wait sees the response."""
    ctx.custom_data["answer"] = ctx.response
    call(ctx, "answered")


def lines(ctx: StepContext) -> list[Child]:
    """One child per line of the order (to the line route of the parent's service)."""
    return [
        Child(
            f"{ctx.message.service}.line", payload={"prefix": ctx.payload["prefix"], **line}, object_id=str(line["sku"])
        )
        for line in ctx.payload["lines"]
    ]


@step
def book_line(ctx: StepContext) -> None:
    """Child step."""
    call(ctx, "line")


@step
def after_lines(ctx: StepContext) -> None:
    """Runs once every child is OK."""
    call(ctx, "after")


ordered = scripted("ordered")  # funnel members: the external system records overlapping calls


def behaviour_routes(service: str, fused: bool = False, batch: int | None = None) -> list[Route]:
    """The behaviour suite's routes under `service`: "test" in chain mode, "fused" in fused mode,
    "batched" in batches of up to 20 messages."""

    def orders(ctx: StepContext) -> list[Child]:
        """Nested split: one order child per group of lines."""
        return [
            Child(f"{service}.order", payload={"prefix": ctx.payload["prefix"], "lines": group})
            for group in ctx.payload["groups"]
        ]

    def group_members(ctx: StepContext) -> list[Child]:
        """Children in the same funnel as their parent."""
        return [
            Child(f"{service}.funnel", payload={"prefix": ctx.payload["prefix"], "group": ctx.payload["group"], "n": n})
            for n in range(2)
        ]

    def route(name: str, steps: list, **options) -> Route:
        options.setdefault("errors", {"E400": "the scripted step refuses the message"})
        return Route(f"{service}.{name}", steps=steps, fused=fused, batch=batch, **options)

    @step(key="quote")
    def quote(ctx: StepContext) -> dict:
        """A synchronous route's last step: calls the external system (slow when a test delays its path) and
        returns the route's result."""
        call(ctx, "quote")
        return {"quote": 10 * int(ctx.payload.get("n", 1)), "prefix": ctx.payload["prefix"]}

    @step(key="bill", system=f"{service}-billing")  # a breaker of its own per mode
    def bill(ctx: StepContext) -> None:
        call(ctx, "bill")

    @step(key="post", system=f"{service}-post")  # one call in flight at most (OPENHUB_SYSTEM_LIMITS)
    def post(ctx: StepContext) -> None:
        call(ctx, "post")

    @step(key="paced", system=f"{service}-paced")  # two calls a second (OPENHUB_SYSTEM_RATES)
    def paced(ctx: StepContext) -> None:
        call(ctx, "paced")

    return [
        route("flow", [step_a, step_b, step_c]),
        route("entity", [sync_entity], object_id=lambda p: p["id"], entity_type="thing"),
        route("custom", [charge]),
        route("fragile", [step_a, fragile]),
        route("slow", [step_a, slow, step_c]),
        route("long", [step_a, patient, step_c]),  # a worker is killed mid-call: the call's timeout is far off
        route("patient", [patient]),
        route("pooled", [pooled]),
        # CRM (or CONFIRMED) asks, SHOP answers (the third party): issue 27's sources and responders
        route("wait", [wait_answer, use_answer], sources=["CRM", "CONFIRMED"], responders=["SHOP"]),
        route("order", [step_a, Split(lines, route=f"{service}.line"), after_lines]),
        route("line", [book_line]),
        route("funnel", [ordered], funnel=lambda p: p["group"]),
        route(
            "ordered", [ordered], funnel=lambda p: p["group"], guaranteed_order=True, order_timeout=timedelta(seconds=3)
        ),
        route("ordered_x", [ordered], funnel=lambda p: p["group"], guaranteed_order=True, exclude_failed=True),
        route("nest", [Split(orders, route=f"{service}.order")]),
        route("funnelled_split", [Split(group_members, route=f"{service}.funnel")], funnel=lambda p: p["group"]),
        route("badsplit", [Split(lambda ctx: [{"sku": 1}], key="malformed")]),
        route("held", [step_a]),
        route("billed", [step_a, bill]),
        route("limited", [step_a, post]),
        route("paced", [paced]),
        *([route("quote", [step_a, quote], sync=True)] if batch is None else []),  # a sync route is never batched
    ]


routes = behaviour_routes("test") + behaviour_routes("fused", fused=True) + behaviour_routes("batched", batch=20)


def _delivery_routes() -> list[Route]:  # after `call` is defined: they call out through it
    from tests.support import delivery_routes

    return delivery_routes.routes


routes += _delivery_routes()


@confirmation("CONFIRMED")
def confirm(outcome: Outcome) -> None:
    """Confirm to the external system (its path from the payload), failing when it fails."""
    prefix = outcome.message.payload["prefix"]
    httpx.post(
        f"{external_url()}{prefix}/confirm",
        json=outcome.as_dict(),
        headers={"Idempotency-Key": f"{outcome.message.id}:{outcome.state}", "X-Test-Pid": str(os.getpid())},
        timeout=10,
    ).raise_for_status()


SOAP_XSD = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:example:customers"
           xmlns="urn:example:customers" elementFormDefault="qualified">
  <xs:element name="customer"><xs:complexType><xs:sequence>
    <xs:element name="id" type="xs:string"/>
    <xs:element name="name" type="xs:string"/>
    <xs:element name="credit" type="xs:decimal" minOccurs="0"/>
  </xs:sequence><xs:attribute name="kind" type="xs:string"/></xs:complexType></xs:element>
</xs:schema>"""


@step(key="soap_seen")
def soap_seen(ctx: StepContext) -> None:
    """A SOAP route's step: the payload is the decoded dict, which it hands to the external system."""
    assert isinstance(ctx.payload, dict) and ctx.payload["id"], ctx.payload
    httpx.post(f"{external_url()}/soap/{ctx.payload['id']}", json=ctx.payload, timeout=10).raise_for_status()


routes.append(Route("soaptest.setCustomer", steps=[soap_seen], soap=Soap(xsd=SOAP_XSD, element="customer")))
