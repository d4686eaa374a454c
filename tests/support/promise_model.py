"""A model-based test of the promise (issue 26): a hypothesis state machine over LocalHub.

Its rules interleave what happens to a hub in production: messages submitted to routes with entity
scope, funnels, sequential and parallel splits and waits; chains run; steps that fail; poller ticks
hours apart; and, while a step's call is in flight, an operator's cancel, restart, total restart,
drain and end of the drain, a responder's answer (or its duplicate), followed by whatever chains
those publish, run at once beside the call. After every rule the invariants are checked against
the external systems' own log (`promise_routes.CALLS`, what each call's key saw), not the hub's view.

`tests/integration/test_promise_model.py` runs it with a fixed seed in CI; `bench/model_soak.py`
runs it long.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import select

import openhub
from openhub import operator
from openhub.db import transaction
from openhub.errors import OpenHubError
from openhub.schema import ext_calls, messages
from openhub.states import FINAL
from tests.support import promise_routes as routes

# route -> the payloads it is given (splits make children of p.leaf)
ROUTES = {
    "p.flow": lambda n: {},
    "p.fused": lambda n: {},
    "p.entity": lambda n: {"id": str(n % 2)},
    "p.split_hooked": lambda n: {"children": 2},
    "p.sequence": lambda n: {"children": 3},
    "p.funnel": lambda n: {"group": "g"},
    "p.two_waits": lambda n: {},
    "p.batch": lambda n: {},
    "p.batch_entity": lambda n: {"id": str(n % 2)},
    "p.batch_funnel": lambda n: {"group": "g"},
    "p.batch_waits": lambda n: {},
}
STEPS = ["*", "*", "first", "second", "sync", "split"]  # "*": the next call of any step
FINAL_STATES = {s.value for s in FINAL}
ASKED = {"waits", "waits_again"}  # calls that ask a question answered through openhub.respond()
ACTIONS = ["cancel", "restart", "total_restart", "cancel_restart", "drain_undrain", "respond", "respond_twice",
           "fail", "reject"]
TARGETS = ["self", "parent", "oldest"]


class PromiseMachine(RuleBasedStateMachine):
    """The hub, the external systems' log, and what the model believes must hold."""

    def __init__(self) -> None:
        super().__init__()
        self._hub_cm = routes.local_hub(OPENHUB_RETRY_INTERVAL="60", OPENHUB_LEASE_GRACE="300",
                                        OPENHUB_MAX_FAILS="3", OPENHUB_POSTPONE_INTERVAL="5")
        self.hub = self._hub_cm.__enter__()
        self.ids: list[int] = []
        self.count = 0
        self.minutes = 0  # how far the poller's clock has moved ahead of the wall clock

    def teardown(self) -> None:
        self._hub_cm.__exit__(None, None, None)

    # --- rules ------------------------------------------------------------------------------------------
    @rule(route=st.sampled_from(sorted(ROUTES)))
    def submit(self, route: str) -> None:
        self.count += 1
        view = self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}")
        self.ids.append(view.id)

    @rule(step=st.sampled_from(STEPS), action=st.sampled_from(ACTIONS), whom=st.sampled_from(TARGETS),
          nested=st.booleans())
    def arm_in_flight(self, step: str, action: str, whom: str, nested: bool) -> None:
        """The next call of `step` does `action` to `target` while it is in flight (once), and with
        `nested` runs at once whatever chains that published, beside the call; `whom` is the message
        calling, its parent or the oldest message."""
        def hook(ctx: Any) -> None:
            routes.HOOKS.pop(step, None)
            if action == "fail":
                raise RuntimeError(f"{step} answered 503")
            if action == "reject":
                raise openhub.Reject(f"{step} refused it")
            self._act(action, self._target(ctx, whom))
            if nested:
                self.hub.run(seconds=self.minutes * 60)

        routes.HOOKS[step] = hook

    @rule(route=st.sampled_from(sorted(ROUTES)), action=st.sampled_from(ACTIONS), whom=st.sampled_from(TARGETS),
          nested=st.booleans())
    def submit_and_interrupt(self, route: str, action: str, whom: str, nested: bool) -> None:
        """A message whose chain meets `action` at its first call (the others' chains run first)."""
        self.hub.run(seconds=self.minutes * 60)
        self.submit(route)
        self.arm_in_flight("*", action, whom, nested)
        self.hub.run(limit=1, seconds=self.minutes * 60)

    @rule()
    def run(self) -> None:
        self.hub.run(seconds=self.minutes * 60)

    @rule()
    def run_one_chain(self) -> None:
        self.hub.run(limit=1, seconds=self.minutes * 60)

    @rule(minutes=st.sampled_from([0, 1, 10, 120]))
    def tick(self, minutes: int) -> None:
        self.minutes += minutes
        self.hub.tick(seconds=self.minutes * 60)

    @precondition(lambda self: self.ids)
    @rule(action=st.sampled_from(["cancel", "restart", "total_restart", "respond", "drain_undrain"]),
          pick=st.integers(min_value=0))
    def operator_acts(self, action: str, pick: int) -> None:
        self._act(action, self.ids[pick % len(self.ids)])
        self.hub.run(seconds=self.minutes * 60)

    def _target(self, ctx: Any, target: str) -> int:
        if target == "parent" and ctx.message.parent_id is not None:
            return int(ctx.message.parent_id)
        if target == "oldest" and self.ids:
            return self.ids[0]
        return int(ctx.message.id)

    def _act(self, action: str, target: int) -> None:
        try:
            if action in ("cancel", "cancel_restart"):
                operator.cancel(target)
            if action in ("restart", "cancel_restart"):
                operator.restart(target)
            elif action == "total_restart":
                operator.restart(target, total=True)
            elif action in ("respond", "respond_twice"):
                # The responder of the message's latest question, with the token it was given (an answer to
                # a question that ended, or twice, or before any was asked, is refused or a duplicate).
                asked = [token for message, _step, token in routes.ASKS if message == target]
                for _ in range(2 if action == "respond_twice" else 1):
                    operator.respond(target, {"answer": target}, token=asked[-1] if asked else None)
            elif action == "drain_undrain":
                operator.drain("model")
                operator.undrain()
        except OpenHubError:  # refused for the state it is in (409): nothing happened
            pass

    # --- invariants -------------------------------------------------------------------------------------
    @invariant()
    def no_successful_call_made_twice(self) -> None:
        """Each idempotency key saw at most one successful call; but a question whose answer did not come
        in time is asked again, by design (a response timeout is a transient failure of the wait)."""
        twice = {key: n for key, n in Counter(k for step, k in routes.CALLS if step not in ASKED).items() if n > 1}
        assert not twice, f"successful calls made twice: {twice}"

    @invariant()
    def never_two_calls_of_one_step_in_flight(self) -> None:
        """No (message, step) had two calls in flight at once."""
        assert not routes.OVERLAPS, f"two calls of one step in flight at once: {routes.OVERLAPS}"

    @invariant()
    def a_sequential_family_runs_one_child_at_a_time(self) -> None:
        """No two children of a sequential split called out at once."""
        with transaction() as conn:
            sequential = set(conn.execute(select(messages.c.id).where(messages.c.operation == "sequence")).scalars())
        both = {p: n for p, n in routes.FAMILY_MOST.items() if p in sequential and n > 1}
        assert not both, f"children of a sequential split called out at once: {both}"

    @invariant()
    def a_split_done_has_its_children(self) -> None:
        """A split step recorded OK has written its children."""
        with transaction() as conn:
            done = conn.execute(select(ext_calls.c.message_id).where(
                ext_calls.c.step_key.in_(("many", "hooked_many")), ext_calls.c.state == "OK")).scalars().all()
            for parent in done:
                children = conn.execute(select(messages.c.id).where(messages.c.parent_id == parent)).all()
                assert children, f"message {parent}'s split was recorded OK without children"

    @invariant()
    def a_sequential_family_calls_in_order(self) -> None:
        """The children of a sequential split made their first calls one after another, in their order."""
        family: dict[int, list[tuple[int, int]]] = {}
        with transaction() as conn:
            parents = select(messages.c.id).where(messages.c.operation == "sequence")
            for r in conn.execute(select(messages.c.id, messages.c.parent_id, ext_calls.c.id.label("call"))
                                  .join(ext_calls, ext_calls.c.message_id == messages.c.id)
                                  .where(messages.c.parent_id.in_(parents))):
                family.setdefault(r.parent_id, []).append((r.call, r.id))
        for parent, calls in family.items():
            by_call = [child for _, child in sorted(calls)]
            assert by_call == sorted(by_call), f"sequential children of {parent} called out of order: {by_call}"

    @rule()
    def settle(self) -> None:
        """With no more faults and enough time, every message ends (or waits for its answer)."""
        routes.HOOKS.clear()
        self._act("drain_undrain", 0)
        for _ in range(8):
            self.minutes += 120
            self.hub.tick(seconds=self.minutes * 60)
        stuck = {v.id: v.state for v in openhub.list_messages(limit=1000)
                 if v.state not in FINAL_STATES and v.state != "WAITING_FOR_RES"}
        assert not stuck, f"messages not final after 16 quiet hours: {stuck}"
