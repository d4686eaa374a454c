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
from openhub.config import get_settings
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
           "respond_stale", "fail", "reject", "crash", "poison"]
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
        self.fails: Counter[int] = Counter()  # message -> failures the model injected in its calls
        self.poisoned: set[int] = set()  # messages made poison (each of their calls takes the worker down)
        self.answered: set[str] = set()  # wait tokens the model's responder answered (taken or kept)
        self.wrong: list[str] = []  # answers the hub took wrongly (noted here: a hook's assert would fail its step)

    def teardown(self) -> None:
        self._hub_cm.__exit__(None, None, None)

    # --- rules ------------------------------------------------------------------------------------------
    @rule(route=st.sampled_from(sorted(ROUTES)))
    def submit(self, route: str) -> None:
        self.count += 1
        view = self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}")
        self.ids.append(view.id)

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(min_value=0))
    def submit_like_a_child(self, pick: int) -> None:
        """A source system's message whose id reads like the first child of an earlier message (issue 26 #5):
        its calls' idempotency keys must not be that child's."""
        self.count += 1
        parent = self.ids[pick % len(self.ids)]
        view = self.hub.submit("p.leaf", {}, correlation_id=f"{openhub.get_message(parent).correlation_id}#0.1")
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
                self.fails[int(ctx.message.id)] += 1
                raise RuntimeError(f"{step} answered 503")
            if action == "reject":
                self.fails[int(ctx.message.id)] += 1
                raise openhub.Reject(f"{step} refused it")
            if action == "crash":
                raise routes.WorkerDied(f"the worker died in {step}")
            if action == "poison":
                self.poisoned.add(int(ctx.message.id))
                routes.POISON.add(int(ctx.message.id))
                raise routes.WorkerDied(f"message {ctx.message.id} takes its worker down")
            self._act(action, self._target(ctx, whom))
            if nested:
                self.hub.run(seconds=self.minutes * 60)  # a worker dying in there takes this call down too

        routes.HOOKS[step] = hook

    @rule(route=st.sampled_from(sorted(ROUTES)), action=st.sampled_from(ACTIONS), whom=st.sampled_from(TARGETS),
          nested=st.booleans())
    def submit_and_interrupt(self, route: str, action: str, whom: str, nested: bool) -> None:
        """A message whose chain meets `action` at its first call (the others' chains run first)."""
        self._run()
        self.submit(route)
        self.arm_in_flight("*", action, whom, nested)
        self._run(limit=1)

    @rule()
    def run(self) -> None:
        self._run()

    @rule()
    def run_one_chain(self) -> None:
        self._run(limit=1)

    @rule(minutes=st.sampled_from([0, 1, 10, 120]))
    def tick(self, minutes: int) -> None:
        self.minutes += minutes
        self._tick()

    @rule()
    def lose_broker(self) -> None:
        """The broker restarts empty: the chains published and not yet run are lost. Within two poll
        intervals every one of them is published again (issue 33 #9), not after OPENHUB_LEASE_GRACE."""
        self.hub.lose_broker()
        poll = get_settings().poll_interval.total_seconds()
        self._tick()
        self._tick(extra=poll + 1)
        with transaction() as conn:
            # published and not yet run (a sequential split's children awaiting their turn have no due time)
            lost = conn.execute(select(messages.c.id).where(messages.c.state.in_(("NEW", "IN_QUEUE")),
                                                            messages.c.due_at.is_not(None))).scalars().all()
        assert not lost or self.hub.publisher.chains, f"chains lost with the broker not published again: {lost}"

    def _run(self, limit: int = 10_000) -> None:
        """Run the published chains; a worker dying in one (WorkerDied) leaves its run to the repair."""
        try:
            self.hub.run(limit=limit, seconds=self.minutes * 60)
        except routes.WorkerDied:
            pass

    def _tick(self, extra: float = 0.0) -> None:
        """A poller tick at the model's time (`extra` seconds later), and the chains it published run."""
        try:
            self.hub.tick(seconds=self.minutes * 60 + extra)
        except routes.WorkerDied:
            pass

    @precondition(lambda self: self.ids)
    @rule(action=st.sampled_from(["cancel", "restart", "total_restart", "respond", "respond_stale",
                                  "drain_undrain"]),
          pick=st.integers(min_value=0))
    def operator_acts(self, action: str, pick: int) -> None:
        self._act(action, self.ids[pick % len(self.ids)])
        self._run()

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
                # a question that ended, or twice, or before any was asked, is refused or a duplicate). Every
                # answer has the same content: only the token tells the waits apart (issue 33 #2).
                asked = [token for message, _step, token in routes.ASKS if message == target]
                token = asked[-1] if asked else None
                for _ in range(2 if action == "respond_twice" else 1):
                    view = operator.respond(target, {"answer": target}, token=token)
                    if token is not None:
                        if view.duplicate and token not in self.answered:
                            self.wrong.append(f"message {target}: the first answer to wait {token} was dropped "
                                              "as a duplicate")
                        self.answered.add(token)
            elif action == "respond_stale":
                # A late retry of the answer to the question before the latest (answered, or asked again since):
                # a duplicate or refused, never taken for the wait open now (issue 33 #1).
                asked = [token for message, _step, token in routes.ASKS if message == target]
                if len(asked) >= 2:
                    view = operator.respond(target, {"answer": target, "stale": True}, token=asked[-2])
                    if not view.duplicate:
                        self.wrong.append(f"message {target}: an answer to the ended wait {asked[-2]} was taken")
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
    def each_wait_answered_by_its_own_answer(self) -> None:
        """An answer is taken for the wait its token names: a first answer is never a duplicate (issue 33 #2),
        an answer to a wait that ended is never taken (issue 33 #1), no step runs with one."""
        assert not self.wrong, "; ".join(self.wrong)
        assert not routes.STALE_TAKEN, f"steps given an answer to an ended wait: {routes.STALE_TAKEN}"

    @invariant()
    def no_failure_counted_but_the_calls(self) -> None:
        """A message's failures are its calls' (those the model failed or rejected), never a fault of the
        hub's own: a worker lost with its run is no failure (issue 33 #10); a poison message ends FAILED
        once (OPENHUB_MAX_LOST_RUNS). Routes with waits are left out: a response timeout is a failure."""
        with transaction() as conn:
            rows = conn.execute(select(messages.c.id, messages.c.failed_count, messages.c.operation)).all()
        over = {r.id: (r.failed_count, self.fails[r.id]) for r in rows
                if r.operation not in ("two_waits", "batch_waits")
                and r.failed_count > self.fails[r.id] + (r.id in self.poisoned)}
        assert not over, f"failures counted beyond the calls' (counted, injected): {over}"

    @invariant()
    def each_transition_confirmed_under_its_own_id(self) -> None:
        """A receiver dedups by the webhook id: two transitions (a message FAILED, restarted, FAILED again)
        never share one (issue 26 #6); the retries of one share it."""
        shared = {key: seen for key, seen in routes.DELIVERIES.items() if len(seen) > 1}
        assert not shared, f"transitions confirmed under one webhook id: {shared}"

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
        """With no more faults and enough time (up to 32 quiet hours), every message ends (or waits for its answer)."""
        routes.HOOKS.clear()
        self._act("drain_undrain", 0)
        for _ in range(16):  # a poison message's runs are lost until OPENHUB_MAX_LOST_RUNS (5) ends it FAILED
            self.minutes += 120
            self._tick()
            stuck = {v.id: v.state for v in openhub.list_messages(limit=1000)
                     if v.state not in FINAL_STATES and v.state != "WAITING_FOR_RES"}
            if not stuck:
                break
        assert not stuck, f"messages not final after 32 quiet hours: {stuck}"
