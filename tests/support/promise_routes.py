"""Routes for the promise tests: each step's "external call" is a line in CALLS, and a test can
hook code into a step (run mid-call) to cancel, restart or fail at exactly that point.

The tests run them in-process on `openhub.testing.LocalHub`, so a hook runs while its step's
call is in flight, as a concurrent operator or worker would.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator

from openhub import Child, Outcome, RetryPolicy, Route, Split, StepContext, Topic, confirmation, on_state, step

CALLS: list[tuple[str, str]] = []  # (step, idempotency key) of every call that succeeded
ACTIVE: dict[str, int] = {}  # step -> calls in flight now
MOST: dict[str, int] = {}  # step -> most calls in flight at once
HOOKS: dict[str, Callable[[StepContext], Any]] = {}  # step ("*": any) -> run mid-call (may raise to fail it)
CONFIRMED: list[tuple[int, str]] = []
DELIVERIES: dict[str, set[tuple[int, str, int | None]]] = {}  # webhook id -> the transitions confirmed with it
IN_FLIGHT: dict[str, int] = {}  # idempotency key -> calls in flight now
OVERLAPS: list[str] = []  # keys that had two calls in flight at once
FAMILY: dict[int, int] = {}  # split parent -> its children's calls in flight now
FAMILY_MOST: dict[int, int] = {}  # split parent -> most of its children's calls in flight at once
ASKS: list[tuple[int, str, str]] = []  # (message, asking step, its wait token) of each question asked
POISON: set[int] = set()  # messages whose every call takes its worker down (WorkerDied), until forgotten
STALE_TAKEN: list[tuple[int, str, Any]] = []  # (message, step, response): a step given an answer meant for no open wait
CONFIRM_CALLS: list[str] = []  # the webhook id of each confirmation the confirmer made (ended successfully)
STARTS: list[tuple[int, str]] = []  # (message, step) of every call begun, in the order they began
BEGUN: list[tuple[str, bool]] = []  # (idempotency key, ctx.redelivered) of each call of STARTS, by its index
DIED: set[int] = set()  # indexes in STARTS of the calls their worker died in (WorkerDied: no outcome recorded)


class WorkerDied(BaseException):
    """The worker running a step died mid-call (raised by a hook or a poisoned message): LocalHub notes
    the crash, and the next tick finds the run lost."""


def reset() -> None:
    """Forget every call, hook and confirmation."""
    for registry in (
        CALLS,
        ACTIVE,
        MOST,
        HOOKS,
        CONFIRMED,
        NOTIFIED,
        ANSWERS,
        IN_FLIGHT,
        OVERLAPS,
        FAMILY,
        FAMILY_MOST,
        ASKS,
        POISON,
        STALE_TAKEN,
        DELIVERIES,
        STARTS,
        BEGUN,
        DIED,
        CONFIRM_CALLS,
    ):
        registry.clear()


@contextmanager
def local_hub(**env: str) -> Iterator[Any]:
    """A LocalHub over these routes (messages from source system CONFIRMED, which has a confirmer),
    with every call, hook and confirmation forgotten before and after. Given OPENHUB_DATABASE_URL (a
    migrated PostgreSQL database), every table of that store is emptied first."""
    from openhub.store.db import transaction
    from openhub.store.schema import Base
    from openhub.testing import LocalHub

    reset()
    if "OPENHUB_DATABASE_URL" in env:
        with transaction(env["OPENHUB_DATABASE_URL"]) as conn:
            conn.exec_driver_sql(
                f"TRUNCATE {', '.join(t.name for t in Base.metadata.sorted_tables)} RESTART IDENTITY CASCADE"
            )
    try:
        with LocalHub(__name__, source_system="CONFIRMED", **env) as hub:
            yield hub
    finally:
        reset()


def token(message_id: int, step: str, ask: int = -1) -> str:
    """The wait token the `ask`-th question of `step` ("waits" or "waits_again") gave for the message
    (the last by default), as its responder got it."""
    return [t for m, s, t in ASKS if m == message_id and s == step][ask]


def calls(name: str, key: str | None = None) -> int:
    """How many calls of step `name` (with idempotency key `key`) succeeded."""
    return sum(1 for s, k in CALLS if s == name and (key is None or k == key))


def external(name: str) -> Callable[[StepContext], None]:
    """A step whose call runs the test's hook in flight, then succeeds (unless the hook raised)."""

    def run(ctx: StepContext) -> None:
        begun = len(STARTS)
        STARTS.append((int(ctx.message.id), name))
        BEGUN.append((ctx.idempotency_key, ctx.redelivered))
        ACTIVE[name] = ACTIVE.get(name, 0) + 1
        MOST[name] = max(MOST.get(name, 0), ACTIVE[name])
        key = ctx.idempotency_key
        IN_FLIGHT[key] = IN_FLIGHT.get(key, 0) + 1
        if IN_FLIGHT[key] > 1:
            OVERLAPS.append(key)
        parent = ctx.message.parent_id
        if parent is not None:
            FAMILY[parent] = FAMILY.get(parent, 0) + 1
            FAMILY_MOST[parent] = max(FAMILY_MOST.get(parent, 0), FAMILY[parent])
        response = getattr(ctx, "response", None)
        if isinstance(response, dict) and response.get("stale"):
            STALE_TAKEN.append((ctx.message.id, name, response))
        try:
            if ctx.message.id in POISON:
                raise WorkerDied(f"message {ctx.message.id} takes its worker down")
            hook = HOOKS.get(name) or HOOKS.get("*")
            if hook is not None:
                hook(ctx)
            CALLS.append((name, ctx.idempotency_key))
        except WorkerDied:  # its own, or a nested run's (a hook's) that took this call down with it
            DIED.add(begun)
            raise
        finally:
            ACTIVE[name] -= 1
            IN_FLIGHT[key] -= 1
            if parent is not None:
                FAMILY[parent] -= 1

    run.__name__ = name
    return run


first, second = step(external("first")), step(external("second"))
bill = step(key="bill", system="billing")(external("bill"))
sync = step(key="sync", scope="entity")(external("sync"))


@step(key="quote")
def quote(ctx: StepContext) -> dict:
    """A synchronous route's last step: its call, then the route's result, naming the call it came from."""
    external("quote")(ctx)
    return {"message": int(ctx.message.id), "key": ctx.idempotency_key}


@step
def stamp(ctx: StepContext) -> None:
    """A successful call that leaves a datetime in custom_data (not JSON)."""
    external("stamp")(ctx)
    ctx.custom_data["when"] = datetime(2026, 11, 23)


def ask(ctx: StepContext, name: str) -> None:
    """The question's call: the responder is given the wait's token (before the test's hook runs in it)."""
    ASKS.append((ctx.message.id, name, str(ctx.wait_token)))
    external(name)(ctx)


@step
def wait_reply(ctx: StepContext) -> None:
    """A call whose answer comes back later through openhub.respond()."""
    ask(ctx, "waits")
    ctx.wait_for_response(timedelta(hours=1))


@step
def use_reply(ctx: StepContext) -> None:
    """The step after a wait: the response must be there."""
    assert ctx.response is not None, "the step after the wait ran without its response"
    external("use_reply")(ctx)


ANSWERS: list[Any] = []  # the responses the step after a second wait was given


@step(key="wait_again")
def wait_again(ctx: StepContext) -> None:
    """A second question, answered later through openhub.respond()."""
    ask(ctx, "waits_again")
    ctx.wait_for_response(timedelta(hours=1))


@step
def use_answer(ctx: StepContext) -> None:
    """The step after the second wait: notes the answer it was given."""
    ANSWERS.append(ctx.response)
    external("use_answer")(ctx)


class OutOfStock(Exception):
    """A business refusal the route declares fatal."""


@step(fatal=OutOfStock)
def reserve(ctx: StepContext) -> None:
    """Raises what the payload says: fatal by declaration, an HTTP answer, or a plain fault."""
    what = ctx.payload.get("raise")
    if what == "out_of_stock":
        raise OutOfStock("sku 7 is out of stock")
    if what == "http":
        import httpx

        httpx.post(ctx.payload["url"], headers={"Idempotency-Key": ctx.idempotency_key}).raise_for_status()
    if what == "bug":
        raise KeyError("price")
    external("reserve")(ctx)


@step(key="rekeyed", scope="custom", custom_key=lambda ctx: f"rekeyed-{ctx.message.id}-{ctx.custom_data.get('gen', 0)}")
def rekeyed(ctx: StepContext) -> None:
    """A call whose custom key changes with each of its runs: a retry calls it again, and finds the step
    after it already OK."""
    external("rekeyed")(ctx)
    ctx.custom_data["gen"] = ctx.custom_data.get("gen", 0) + 1


FOREVER = RetryPolicy(max_fails=None, interval=timedelta(minutes=1), backoff=2, max_interval=timedelta(minutes=10))


def many(ctx: StepContext) -> list[Child]:
    """As many children as the payload asks for."""
    return [Child("p.leaf", payload={"n": n}) for n in range(ctx.payload["children"])]


def bad_children(ctx: StepContext) -> list[Child]:
    """Children whose object id (from a hostile payload) holds a NUL."""
    return [Child("p.leaf", payload={}, object_id=line["sku"]) for line in ctx.payload["lines"]]


def hooked_many(ctx: StepContext) -> list[Child]:
    """`many`, running the test's hook "split" while the split step runs."""
    hook = HOOKS.get("split") or HOOKS.get("*")
    if hook is not None:
        hook(ctx)
    return many(ctx)


routes = [
    Route("p.big", steps=[Split(many, route="p.leaf")]),
    Route("p.leaf", steps=[first]),
    Route("p.reserve", steps=[reserve]),
    Route("p.flow", steps=[first, second]),
    Route("p.fused", steps=[first, second], fused=True),
    Route("p.sync", steps=[first, quote], sync=True),
    Route("p.billing", steps=[first, bill]),
    Route("p.limited", steps=[step(key="post", system="post")(external("post"))]),
    Route("p.paced", steps=[step(key="paced", system="paced")(external("paced"))]),
    Route("p.expiring", steps=[first, second], expires_after=timedelta(minutes=10)),
    Route("p.sequence", steps=[Split(many, route="p.leaf", sequential=True)]),
    Route("p.split_hooked", steps=[Split(hooked_many, route="p.leaf")]),
    Route("p.lines", steps=[Split(bad_children, route="p.leaf"), second]),
    Route("p.told", steps=[Split(many, key="told", route="p.leaf", confirm_children=True)]),
    Route("p.big_expiring", steps=[Split(many, route="p.leaf")], expires_after=timedelta(minutes=10)),
    Route("p.stamp", steps=[stamp, second]),
    Route("p.entity", steps=[sync, second], object_id=lambda p: p["id"], entity_type="thing"),
    Route("p.funnel", steps=[first], funnel=lambda p: p["group"]),
    Route("p.waiting", steps=[wait_reply], funnel=lambda p: p["group"]),
    Route("p.answered", steps=[first, wait_reply, use_reply]),
    Route("p.two_waits", steps=[wait_reply, second, wait_again, use_answer]),
    Route(
        "p.ordered",
        steps=[first],
        funnel=lambda p: p["group"],
        guaranteed_order=True,
        order_timeout=timedelta(seconds=3),
    ),
    # Batch routes (openhub.engine.batch): several messages per task, in lockstep.
    Route("p.batch", steps=[first, second], batch=3),
    Route("p.batch_entity", steps=[sync, second], object_id=lambda p: p["id"], entity_type="thing", batch=3),
    Route("p.batch_funnel", steps=[first], funnel=lambda p: p["group"], batch=3),
    Route("p.rekeyed", steps=[rekeyed, second, first], fused=True),
    Route("p.batch_rekeyed", steps=[rekeyed, second, first], batch=3),
    Route("p.batch_waits", steps=[wait_reply, second, wait_again, use_answer], batch=3),
    # Issue 37: retried for ever (its back-off capped at ten minutes); independent children.
    Route("p.forever", steps=[first, second], retry=FOREVER),
    Route("p.unbound", steps=[first, Split(hooked_many, key="unbound_many", route="p.leaf", bound=False), second]),
    # Fan-out (issue 37, part 2): a topic and its three receivers, one retried for ever.
    Topic("p.published"),
    *(Route(name, steps=[first, second], subscribes="p.published") for name in ("p.sub_a", "p.sub_b")),
    Route("p.sub_c", steps=[first], subscribes="p.published", retry=FOREVER),
]
RECEIVERS = ("p.sub_a", "p.sub_b", "p.sub_c")  # p.published's, in a family's order


@confirmation("CONFIRMED")
def confirm(outcome: Outcome) -> None:
    """Note what was confirmed (after the test's hook, which may fail it or be slow)."""
    hook = HOOKS.get("confirm")
    if hook is not None:
        hook(outcome)
    CONFIRMED.append((outcome.message.id, outcome.state))
    CONFIRM_CALLS.append(outcome.webhook_id)
    DELIVERIES.setdefault(outcome.webhook_id, set()).add((outcome.message.id, outcome.state, outcome.delivery_id))


NOTIFIED: list[tuple[int, str]] = []


@on_state("FAILED", "PARTLY_FAILED")
def alert(outcome: Outcome) -> None:
    """A state hook: note each failure (after the test's hook, which may fail it)."""
    hook = HOOKS.get("alert")
    if hook is not None:
        hook(outcome)
    NOTIFIED.append((outcome.message.id, outcome.state))
