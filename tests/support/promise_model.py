"""A model-based test of the promise (issue 26): a hypothesis state machine over LocalHub.

Its rules interleave what happens to a hub in production: messages submitted to routes with entity
scope, funnels, sequential and parallel splits and waits; chains run; steps that fail; poller ticks
hours apart; and, while a step's call is in flight, an operator's cancel, restart, total restart,
restart from a step, retry now (issue 36), drain and end of the drain (of everything, or of new messages
only), a host's workers told to finish and back (worker states), an admin's live change of the retry
interval or the max fails, a responder's answer (or its duplicate), followed by whatever chains those
publish, run at once beside the call. After every rule the invariants are checked against the external
systems' own log (`promise_routes.CALLS`, what each call's key saw), not the hub's view.

A synchronous route (p.sync) is submitted as the API does it: the caller waits a while for the message
(openhub.api.sync), and either gets its result or a 202 and sends the same message again later; its result
must be the one its last step's single call gave, never a second call's.

`tests/integration/test_promise_model.py` runs it with a fixed seed in CI; `bench/model_soak.py`
runs it long.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from email.message import Message
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sqlalchemy import select, update
from sqlalchemy.orm import Session

import openhub
from openhub.api import sync
from openhub.core.config import get_settings
from openhub.core.errors import Draining, OpenHubError
from openhub.core.policy import confirmation_lease
from openhub.core.registry import get_registry
from openhub.core.signing import verify_signature
from openhub.core.states import FINAL
from openhub.core.verdicts import idempotency_key
from openhub.service import actions as operator
from openhub.service import settings as live_settings
from openhub.service import worker_states
from openhub.store.db import is_postgres, store_clock
from openhub.store.schema import confirmations, ext_calls, messages, transitions, workers
from tests.support import promise_routes as routes
from tests.support.process_store import store_now, transaction
from tests.support.stubs import PostStub

# route -> the payloads it is given (splits make children of p.leaf)
ROUTES = {
    "p.flow": lambda n: {},
    "p.fused": lambda n: {},
    "p.sync": lambda n: {},
    "p.entity": lambda n: {"id": str(n % 2)},
    "p.split_hooked": lambda n: {"children": 2},
    "p.sequence": lambda n: {"children": 3},
    "p.funnel": lambda n: {"group": "g"},
    "p.two_waits": lambda n: {},
    "p.batch": lambda n: {},
    "p.batch_entity": lambda n: {"id": str(n % 2)},
    "p.batch_funnel": lambda n: {"group": "g"},
    "p.batch_waits": lambda n: {},
    "p.forever": lambda n: {},
    "p.unbound": lambda n: {"children": 2},
    "p.published": lambda n: {},  # a topic: one message per subscribed route (routes.RECEIVERS)
}
ORDERS = sa.table("caller_orders", sa.column("id"))  # the caller's own table, on the hub's database
STEPS = ["*", "*", "first", "second", "sync", "split", "quote"]  # "*": the next call of any step
FINAL_STATES = {s.value for s in FINAL}
ASKED = {"waits", "waits_again"}  # calls that ask a question answered through openhub.respond()
ACTIONS = [
    "cancel",
    "restart",
    "total_restart",
    "cancel_restart",
    "drain_undrain",
    "drain_new_only_undrain",
    "respond",
    "respond_twice",
    "respond_stale",
    "fail",
    "reject",
    "crash",
    "poison",
    "restart_from",
    "retry_now",
]
TARGETS = ["self", "parent", "oldest"]
# Steps whose call record is not the message's own (entity and custom scope): another message may take it over
SHARED_RECORDS = {item.key for route in routes.routes for item in route.steps if item.scope != "message"}
PROTO_SECRET = "the-protocol-systems-own-secret-of-40-chars"


class ProtocolReceiver(PostStub):
    """Source system PROTO's endpoint of the stock confirmation protocol (OPENHUB_CONFIRM_ENDPOINTS, issue 38):
    refuses (503) the next `failing` POSTs; keeps each accepted one's (webhook id, message id, state)."""

    def __init__(self) -> None:
        self.failing = 0
        self.accepted: list[tuple[str, int, str]] = []
        self.unsigned: list[str] = []
        self.lock = threading.Lock()
        super().__init__("protocol-receiver")

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        with self.lock:
            if self.failing:
                self.failing -= 1
                return 503, None, b""
            try:
                verify_signature(PROTO_SECRET, dict(headers.items()), body)
            except OpenHubError as exc:
                self.unsigned.append(str(exc))
            sent = json.loads(body)
            self.accepted.append((headers["webhook-id"], sent["id"], sent["state"]))
        return 200, None, b""


def _empty(url: str) -> None:
    """Every table of the hub's store at `url` emptied: an earlier example's rows (its confirmations claimed on
    a clock hours ahead of this one's, its messages) are not this example's to judge."""
    from openhub.store.schema import Base

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            names = ", ".join(f'"{table.name}"' for table in Base.metadata.sorted_tables)
            conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
    finally:
        engine.dispose()


class PromiseMachine(RuleBasedStateMachine):
    """The hub, the external systems' log, and what the model believes must hold."""

    # The store: LocalHub's own SQLite file, unless a subclass names a migrated PostgreSQL database
    # (tests/integration/test_promise_model.py: the batch's set statements are PostgreSQL's only).
    store: dict[str, str] = {}
    # Settings of a regression example's own (tests/integration/test_promise_regressions.py), over the model's.
    tuned: dict[str, str] = {}

    def __init__(self) -> None:
        super().__init__()
        if self.store:  # a PostgreSQL store outlives each example: it starts empty, as LocalHub's own file does
            _empty(self.store["OPENHUB_DATABASE_URL"])
        self.receiver = ProtocolReceiver()
        endpoint = {"PROTO": {"url": f"{self.receiver.url}/confirm", "max_fails": "forever", "interval": 30}}
        given = {
            "OPENHUB_RETRY_INTERVAL": "60",
            "OPENHUB_LEASE_GRACE": "300",
            "OPENHUB_MAX_FAILS": "3",
            "OPENHUB_POSTPONE_INTERVAL": "5",
            "OPENHUB_CONFIRM_ENDPOINTS": json.dumps(endpoint),
            "OPENHUB_CONFIRM_SECRETS": f"PROTO={PROTO_SECRET}",
            "OPENHUB_CONFIRM_TIMEOUT": "5",
        }
        self._hub_cm = routes.local_hub(**{**given, **self.tuned, **self.store})
        self.hub = self._hub_cm.__enter__()
        self.ids: list[int] = []
        self.count = 0
        self.minutes = 0  # how far the poller's clock has moved ahead of the wall clock
        self.fails: Counter[int] = Counter()  # message -> failures the model injected in its calls
        self.poisoned: set[int] = set()  # messages made poison (each of their calls takes the worker down)
        self.answered: set[str] = set()  # wait tokens the model's responder answered (taken or kept)
        self.wrong: list[str] = []  # answers the hub took wrongly (noted here: a hook's assert would fail its step)
        # message restarted from a step -> (its keys' prefix, the earlier steps it had called, CALLS seen then)
        self.restarted_from: dict[int, tuple[str, set[str], int]] = {}
        self.rejected: set[int] = set()  # messages one of whose calls the model rejected (a verdict: FAILED)
        self.caller = sa.create_engine(get_settings().database_url)  # a service's own, on the hub's database
        with self.caller.begin() as conn:  # a store that outlives the hub (PostgreSQL) has the last one's
            conn.exec_driver_sql("DROP TABLE IF EXISTS caller_orders")
            conn.exec_driver_sql("CREATE TABLE caller_orders (id VARCHAR(200) PRIMARY KEY)")
        self.orders: dict[str, str] = {}  # the caller's order -> how its transaction ended
        self.sync_ids: dict[int, str] = {}  # p.sync messages -> their correlation id (to send them again)
        self.priorities: dict[int, int] = {}  # message -> the priority it was submitted with
        self.acted: set[int] = set()  # messages an operator action named (the only ones it may change)
        self.live: set[str] = set()  # settings an admin gave a live value (forgotten at teardown)
        self.dead_leases: dict[str, float] = {}  # PostgreSQL: a dead sender's claim -> its lease's end (model seconds)
        # message cancelled (acknowledged, and not restarted since) -> how many calls had begun then (routes.STARTS)
        self.cancelled: dict[int, int] = {}
        self.undo: list[Any] = []  # what puts the environment right again (a skewed clock, a fence armed)
        self.acts: dict[int, list[int]] = {}  # message -> how many calls had begun at each operator action on it
        self.fence_next = False  # the next run entered finds this process fenced (`heartbeat_falls_behind...`)
        from openhub.engine import engine

        real_fenced = engine.fenced

        def fenced(since: float) -> bool:  # the engine's question: has the heartbeat fallen behind since?
            if self.fence_next:
                self.fence_next = False
                return True
            return real_fenced(since)

        engine.fenced = fenced
        self.undo.append(lambda: setattr(engine, "fenced", real_fenced))

    def teardown(self) -> None:
        for undo in self.undo:
            undo()
        for name in self.live:  # this process reads the store's values per database: none left for the next hub
            live_settings.unset_setting(name, hub=self.hub.hub)
        self.caller.dispose()
        self._hub_cm.__exit__(None, None, None)
        self.receiver.stop()

    # --- rules ------------------------------------------------------------------------------------------
    @rule(route=st.sampled_from(sorted(ROUTES)))
    def submit(self, route: str) -> None:
        self.count += 1
        view = self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}")
        self.ids.append(view.id)

    @rule(route=st.sampled_from(sorted(ROUTES)))
    def submit_from_a_protocol_system(self, route: str) -> None:
        """A message of source system PROTO, confirmed by the stock protocol (no code) instead of a confirmer."""
        self.count += 1
        view = self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}", source_system="PROTO")
        self.ids.append(view.id)

    @rule(times=st.sampled_from([1, 3, 5]))
    def protocol_receiver_fails(self, times: int) -> None:
        """PROTO's endpoint answers 503 to its next `times` confirmations (more than OPENHUB_CONFIRM_MAX_FAILS:
        its endpoint retries forever)."""
        self.receiver.failing = times

    @initialize(tasks=st.booleans())
    def confirmations_sent_by(self, tasks: bool) -> None:
        """Confirmations sent by a task of their own, the poller handing due ones over to such tasks (as on
        Celery: `openhub.confirm`), or at once by whoever finished the message and by the tick (LocalHub's)."""
        self.hub.publisher.confirm_tasks = tasks

    @rule(pick=st.integers(min_value=0))
    def confirmation_sender_dies(self, pick: int) -> None:
        """A sender claims a due confirmation and dies before it is sent (its process killed): the row stays
        SENDING under that claim until its sending lease ends, and the next sender sends it (issue 33, the
        'OK, never confirmed' of test_hosts: the task it was handed over to left it alone)."""
        C = confirmations.c
        with transaction() as conn:
            due = conn.execute(select(C.id).where(C.state.in_(("PENDING", "FAILED"))).order_by(C.id)).scalars().all()
            if not due:
                return
            lease = confirmation_lease(get_settings())
            claimed_at = store_now() + timedelta(minutes=self.minutes)
            claim = str(uuid.uuid4())
            # As a sender writes its lease (openhub.outbound.confirm): on PostgreSQL on the database's clock,
            # which the model's does not move; `_end_dead_leases` ends it once the model's time is past it.
            conn.execute(
                update(confirmations)
                .where(C.id == due[pick % len(due)])
                .values(
                    state="SENDING", claim=claim, due_at=store_clock(conn, claimed_at) + lease, updated_at=claimed_at
                )
            )
            if is_postgres(conn):
                self.dead_leases[claim] = self.minutes * 60 + lease.total_seconds()

    def _end_dead_leases(self, seconds: float) -> None:
        """On PostgreSQL, a dead sender's lease ends on the database's clock (issue 22), which stays at the wall
        clock's time however far the model's moved on: the leases over `seconds` into the model's time are
        ended there (due now on the database's clock), as that much time passing would."""
        over = [claim for claim, end in self.dead_leases.items() if end <= seconds]
        if not over:
            return
        C = confirmations.c
        with transaction() as conn:
            conn.execute(
                update(confirmations)
                .where(C.claim.in_(over), C.state == "SENDING")
                .values(due_at=store_clock(conn, store_now()))
            )
        for claim in over:
            del self.dead_leases[claim]

    @rule(route=st.sampled_from(sorted(ROUTES)), ends=st.sampled_from(["commit", "rollback", "killed_after_commit"]))
    def submit_in_callers_transaction(self, route: str, ends: str) -> None:
        """A service writes its order and submits its message in one transaction of its own (a Session, on
        the hub's database), then commits, rolls back, or commits and dies before the chain is published
        (the broker never gets it: the poller must publish it)."""
        self.count += 1
        order = f"order{self.count}"
        published = len(self.hub.publisher.chains)
        with Session(self.caller) as session:
            session.execute(sa.insert(ORDERS).values(id=order))
            view = openhub.submit(
                route, ROUTES[route](self.count), source_system="CONFIRMED", correlation_id=order, connection=session
            )
            if ends == "rollback":
                session.rollback()
            else:
                session.commit()
        if ends == "killed_after_commit":  # what the commit published never reached the broker
            while len(self.hub.publisher.chains) > published:
                self.hub.publisher.chains.pop()
        self.orders[order] = ends
        if ends != "rollback":
            self.ids.append(view.id)

    @rule(chains=st.sampled_from([0, 1, 10_000]), wait=st.sampled_from([0.0, 0.02]))
    def call_sync(self, chains: int, wait: float) -> None:
        """A caller of the synchronous route: it submits, the workers run `chains` chains meanwhile, and it
        waits `wait` seconds for the end (the API's wait, openhub.api.sync); ended, its answer must be the
        stored outcome, else it had a 202 and the message goes on."""
        self.count += 1
        cid = f"s{self.count}"
        view = self.hub.submit("p.sync", {}, correlation_id=cid)
        self.ids.append(view.id)
        self.sync_ids[view.id] = cid
        if chains:
            self._run(limit=chains)
        self._check_answer(view.id, wait)

    @rule(action=st.sampled_from(ACTIONS), nested=st.booleans(), wait=st.sampled_from([0.0, 0.02]))
    def call_sync_interrupted(self, action: str, nested: bool, wait: float) -> None:
        """A sync caller whose message meets `action` in its last step's call, the one that gives the result
        (a cancel and restart there: the call succeeded, its outcome is discarded, and the next run skips it)."""
        self._run()
        self.arm_in_flight("quote", action, "self", nested)
        self.call_sync(10_000, wait)

    @precondition(lambda self: self.sync_ids)
    @rule(pick=st.integers(min_value=0))
    def call_sync_again(self, pick: int) -> None:
        """The caller that had a 202 sends the same message again (same correlation id) and waits: the same
        message answers, no second one is made, and its steps are not run again."""
        message_id = sorted(self.sync_ids)[pick % len(self.sync_ids)]
        again = self.hub.submit("p.sync", {}, correlation_id=self.sync_ids[message_id])
        assert (again.id, again.duplicate) == (message_id, True), (again.id, message_id)
        self._check_answer(message_id, 0.0)

    def _check_answer(self, message_id: int, wait: float) -> None:
        row = asyncio.run(sync.ended(self.hub.hub, message_id, wait))
        if row is None:  # the caller's 202: nothing to check until the message ends
            return
        body, status = sync.answer({"id": message_id}, row)
        stored = openhub.get_message(message_id)
        assert (body["state"], body["result"]) == (stored.state, stored.result), (body, stored.state, stored.result)
        assert status == (200 if stored.state == "OK" else 422)

    @rule(
        route=st.sampled_from(sorted(ROUTES)),
        priority=st.integers(min_value=0, max_value=9),
        behind=st.integers(min_value=0, max_value=3),
    )
    def submit_with_priority(self, route: str, priority: int, behind: int) -> None:
        """A message of its own priority, after `behind` of priority 0: the next chain taken is of the
        highest priority waiting (the broker's priority queue; the poller's due scan likewise)."""
        for _ in range(behind):
            self.count += 1
            view = self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}", priority=0)
            self.ids.append(view.id)
            self.priorities[view.id] = 0
        self.count += 1
        view = self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}", priority=priority)
        self.ids.append(view.id)
        self.priorities[view.id] = priority
        waiting = [chain[5] for chain in self.hub.publisher.chains if chain[5] is not None]
        assert max(waiting) >= priority, waiting

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(min_value=0))
    def submit_like_a_child(self, pick: int) -> None:
        """A source system's message whose id reads like the first child of an earlier message (issue 26 #5):
        its calls' idempotency keys must not be that child's."""
        self.count += 1
        parent = self.ids[pick % len(self.ids)]
        view = self.hub.submit("p.leaf", {}, correlation_id=f"{openhub.get_message(parent).correlation_id}#0.1")
        self.ids.append(view.id)

    @rule(
        step=st.sampled_from(STEPS),
        action=st.sampled_from(ACTIONS),
        whom=st.sampled_from(TARGETS),
        nested=st.booleans(),
    )
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
                self.rejected.add(int(ctx.message.id))
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

    @rule(
        route=st.sampled_from(sorted(ROUTES)),
        action=st.sampled_from(ACTIONS),
        whom=st.sampled_from(TARGETS),
        nested=st.booleans(),
    )
    def submit_and_interrupt(self, route: str, action: str, whom: str, nested: bool) -> None:
        """A message whose chain meets `action` at its first call (the others' chains run first)."""
        self._run()
        self.submit(route)
        self.arm_in_flight("*", action, whom, nested)
        self._run(limit=1)

    @rule()
    def heartbeat_falls_behind_before_a_step_runs(self) -> None:
        """This process's heartbeat falls behind (a stall, the store away) just after the next run entered took
        its lease: before its step runs the run finds itself fenced (`workers.fenced`, as the engine asks it),
        lets its lease go and makes no call; the poller drives the message again (issue 33 #10). Its call
        record goes back to what the run found (`a_call_begun_unseen_is_told_redelivered`)."""
        self.fence_next = True

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
            lost = (
                conn.execute(
                    select(messages.c.id).where(
                        messages.c.state.in_(("NEW", "IN_QUEUE")), messages.c.due_at.is_not(None)
                    )
                )
                .scalars()
                .all()
            )
        assert not lost or self.hub.publisher.chains, f"chains lost with the broker not published again: {lost}"

    def _run(self, limit: int = 10_000) -> None:
        """Run the published chains; a worker dying in one (WorkerDied) leaves its run to the repair."""
        try:
            self._end_dead_leases(self.minutes * 60)
            self.hub.run(limit=limit, seconds=self.minutes * 60)
        except routes.WorkerDied:
            pass

    def _tick(self, extra: float = 0.0) -> None:
        """A poller tick at the model's time (`extra` seconds later), and the chains it published run."""
        try:
            self._end_dead_leases(self.minutes * 60 + extra)
            self.hub.tick(seconds=self.minutes * 60 + extra)
        except routes.WorkerDied:
            pass

    @precondition(lambda self: self.ids)
    @rule(
        action=st.sampled_from(
            [
                "cancel",
                "restart",
                "total_restart",
                "respond",
                "respond_stale",
                "drain_undrain",
                "drain_new_only_undrain",
                "restart_from",
                "retry_now",
            ]
        ),
        pick=st.integers(min_value=0),
    )
    def operator_acts(self, action: str, pick: int) -> None:
        self._act(action, self.ids[pick % len(self.ids)])
        self._run()

    @rule(
        name=st.sampled_from(["OPENHUB_RETRY_INTERVAL", "OPENHUB_MAX_FAILS"]),
        value=st.sampled_from([None, "0", "1", "600"]),
    )
    def admin_changes_a_retry_setting(self, name: str, value: str | None) -> None:
        """Issue 36's live configuration: an admin changes the retry interval or the max fails mid-run (or
        forgets the value: 60 s and 3 again). Timing and thresholds only: no message changes state by it, and
        the invariants hold over whatever retries and failures follow."""
        with transaction() as conn:
            before = {r.id: r.state for r in conn.execute(select(messages.c.id, messages.c.state))}
        if value is None:
            if name in self.live:
                live_settings.unset_setting(name, hub=self.hub.hub)
                self.live.discard(name)
        else:
            live_settings.set_setting(name, value, "model", hub=self.hub.hub)
            self.live.add(name)
        with transaction() as conn:
            after = {r.id: r.state for r in conn.execute(select(messages.c.id, messages.c.state))}
        if after != before:
            self.wrong.append(f"a live {name} change moved messages: {before} -> {after}")
        self._run()

    @rule(route=st.sampled_from(sorted(ROUTES)), minutes=st.sampled_from([1, 120]))
    def drain_new_only_while_time_passes(self, route: str, minutes: int) -> None:
        """Issue 36's drain of new messages only: a submission is refused, while the messages stored go on, their
        retries and postponed steps when due, as without a drain (the invariants hold over them); then it ends."""
        operator.drain("model", hold_retries=False)
        try:
            self.count += 1
            try:
                self.hub.submit(route, ROUTES[route](self.count), correlation_id=f"m{self.count}")
                self.wrong.append(f"a {route} message was taken during a drain of new messages")
            except Draining:
                pass
            self._run()
            self.minutes += minutes
            self._tick()
        finally:
            assert operator.undrain() == 0, "a drain of new messages only held stored messages back"

    @rule(route=st.sampled_from(sorted(ROUTES)), fault=st.sampled_from(["fail", "crash"]))
    def retry_now_after_a_failure(self, route: str, fault: str) -> None:
        """A message's first call fails (it waits out its back-off, PARTLY_FAILED) or its worker dies; an operator
        who knows the system is back retries it now (issue 36): no failure counted for that."""
        self._run()
        self.submit(route)
        self.arm_in_flight("*", fault, "self", False)
        self._run(limit=1)
        self._act("retry_now", self.ids[-1])
        self._run()

    @rule(
        action=st.sampled_from(["cancel", "restart", "total_restart", "cancel_restart", "restart_from", "retry_now"]),
        which=st.integers(min_value=0, max_value=2),
        fault=st.sampled_from([None, "fail", "reject", "crash"]),
        chains=st.sampled_from([0, 1, 2, 10_000]),
    )
    def fan_out_and_act_on_one_receiver(self, action: str, which: int, fault: str | None, chains: int) -> None:
        """A topic's message fans out to its receivers; one of them meets `fault` at its first call, and after
        `chains` chains ran an operator acts on that one receiver: its siblings and the family are untouched
        (`a_family_is_its_receivers_and_each_its_own`)."""
        self._run()
        self.submit("p.published")
        receivers = sorted(v.id for v in openhub.list_messages(parent_id=self.ids[-1]))
        assert len(receivers) == len(routes.RECEIVERS), receivers
        if fault is not None:
            self.arm_in_flight("*", fault, "self", False)
        self._run(limit=chains)
        routes.HOOKS.pop("*", None)
        self._act(action, receivers[which])
        self._run()

    def _target(self, ctx: Any, target: str) -> int:
        if target == "parent" and ctx.message.parent_id is not None:
            return int(ctx.message.parent_id)
        if target == "oldest" and self.ids:
            return self.ids[0]
        if target == "newest" and self.ids:  # (regression examples only: a batch's later member)
            return self.ids[-1]
        return int(ctx.message.id)

    def _act(self, action: str, target: int) -> None:
        if action not in ("retry_now", "drain_undrain"):  # (retry now picks its own target below)
            self.acted.add(target)
        target = self._act_on(action, target)
        for message in {target, *self._family(target)}:  # (a restart forgets the calls of its whole family)
            self.acts.setdefault(message, []).append(len(routes.STARTS))

    def _act_on(self, action: str, target: int) -> int:
        """Do `action` to message `target`; the message it was done to (retry now may pick another)."""
        try:
            if action in ("cancel", "cancel_restart"):
                operator.cancel(target)
                self._note_cancelled(target)
            if action in ("restart", "cancel_restart"):
                operator.restart(target)
                self._forget_cancelled(target)
            elif action == "total_restart":
                operator.restart(target, total=True)
                self._forget_cancelled(target)
                self.restarted_from.pop(target, None)  # every call is made again: by design
            elif action == "restart_from":
                self._restart_from(target)
                self._forget_cancelled(target)
            elif action == "retry_now":
                # A message waiting out its back-off (the one picked, or else the first there is): refused otherwise.
                waiting = [v.id for v in openhub.list_messages(limit=1000) if v.state in ("PARTLY_FAILED", "POSTPONED")]
                target = target if target in waiting or not waiting else waiting[target % len(waiting)]
                self.acted.add(target)
                before = openhub.get_message(target).failed_count
                after = operator.retry_now(target).failed_count
                self._forget_cancelled(target)
                if after != before:
                    self.wrong.append(f"message {target}: retry now changed its failure count {before} -> {after}")
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
                            self.wrong.append(
                                f"message {target}: the first answer to wait {token} was dropped as a duplicate"
                            )
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
            elif action == "drain_new_only_undrain":
                # Issue 36: the drain of new messages only, and this host's workers told to finish what they
                # have and back: each audited in a transaction of its own, while a step's call may be in flight.
                operator.drain("model", hold_retries=False)
                worker_states.finish_host(socket.gethostname(), "model")
                worker_states.resume_host(socket.gethostname())
                operator.undrain()
        except OpenHubError:  # refused for the state it is in (409): nothing happened
            pass
        return target

    def _family(self, target: int) -> dict[int, str]:
        """The message and its descendants, with their states."""
        found: dict[int, str] = {}
        frontier = [target]
        with transaction() as conn:
            found.update(conn.execute(select(messages.c.id, messages.c.state).where(messages.c.id == target)).all())
            while frontier:
                rows = conn.execute(
                    select(messages.c.id, messages.c.state).where(messages.c.parent_id.in_(frontier))
                ).all()
                frontier = [r.id for r in rows if r.id not in found]
                found.update((r.id, r.state) for r in rows)
        return found

    def _note_cancelled(self, target: int) -> None:
        """A cancel acknowledged: from now on no call of the message (nor of a descendant it cancelled) may
        begin, until an operator restarts it (`no_call_begun_after_its_cancel`)."""
        for message, state in self._family(target).items():
            if state == "CANCEL":
                self.cancelled.setdefault(message, len(routes.STARTS))

    def _forget_cancelled(self, target: int) -> None:
        for message in self._family(target):
            self.cancelled.pop(message, None)

    def _restart_from(self, target: int) -> None:
        """Restart the message from its route's last step (the second of a two-step route): the model notes
        which earlier steps it had called, which it must never call again (until a total restart)."""
        view = openhub.get_message(target)
        route = get_registry().route(view.route)
        keys = [item.key for item in route.steps]
        row = SimpleNamespace(
            correlation_id=view.correlation_id,
            parent_id=view.parent_id,
            id=view.id,
            source_system=view.source_system,
            generation=0,
        )
        prefix = idempotency_key(row, SimpleNamespace(key=""))  # `<source>/<name>/`: every key of the message
        called = {step for step, key in routes.CALLS if key.startswith(prefix)}
        operator.restart_from(target, keys[-1])  # refused (not final, live children): nothing to note
        self.restarted_from[target] = (prefix, called & set(keys[:-1]), len(routes.CALLS))

    # --- invariants -------------------------------------------------------------------------------------
    @invariant()
    def restart_from_a_step_never_calls_the_steps_before_it(self) -> None:
        """After a restart from step N, the steps before N that the message had called are never called
        again by it (issue 36); N and the later ones are, with new keys (no_successful_call_made_twice)."""
        again = {
            target: [(step, key) for step, key in routes.CALLS[seen:] if key.startswith(prefix) and step in earlier]
            for target, (prefix, earlier, seen) in self.restarted_from.items()
        }
        again = {target: calls for target, calls in again.items() if calls}
        assert not again, f"steps before the restart's step called again: {again}"

    @invariant()
    def each_message_kept_once_with_its_priority(self) -> None:
        """Priorities reorder the work, never lose or double it: every message submitted is stored once,
        with the priority it was given, whatever restarts, repairs and re-drives happened to it."""
        with transaction() as conn:
            rows = conn.execute(
                select(messages.c.id, messages.c.priority, messages.c.correlation_id).where(messages.c.id.in_(self.ids))
            ).all()
        assert {r.id for r in rows} == set(self.ids)  # none lost
        assert len({r.correlation_id for r in rows}) == len(rows)  # none stored twice under two ids
        stored = {r.id: r.priority for r in rows}
        assert {m: stored[m] for m in self.priorities} == self.priorities

    @invariant()
    def no_call_begun_after_its_cancel(self) -> None:
        """Once a cancel was acknowledged to the operator, no call of that message begins (a call in flight
        then may end): not a later batch member's (issue 33 #3), not the next step of a member whose outcome
        the batch's group write would have written though it was cancelled (issue 42)."""
        late = [
            (message, step)
            for n, (message, step) in enumerate(routes.STARTS)
            if message in self.cancelled and n >= self.cancelled[message]
        ]
        assert not late, f"calls begun after their message's cancel was acknowledged: {late}"

    @invariant()
    def a_call_begun_unseen_is_told_redelivered(self) -> None:
        """A call its worker died in (no outcome recorded) may have reached its system: the message's next call
        of that step is told so (`ctx.redelivered`, as JMSRedelivered), also after a run the fence stopped
        before its step ran. Asked of the steps whose call record is the message's own (an entity's record is
        another message's once that one calls), and not where an operator acted on the message since (a
        restart forgets its calls)."""
        died: dict[str, int] = {}  # idempotency key -> the call its worker died in, the key not called since
        untold = []
        for n, ((message, step), (key, redelivered)) in enumerate(zip(routes.STARTS, routes.BEGUN)):
            if step in SHARED_RECORDS:
                continue
            earlier = died.pop(key, None)
            acted = earlier is not None and any(earlier < at <= n for at in self.acts.get(message, ()))
            if earlier is not None and not redelivered and not acted:
                untold.append((message, step, key))
            if n in routes.DIED:
                died[key] = n
        assert not untold, f"calls not told redelivered after a call of theirs ended unseen: {untold}"

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
        over = {
            r.id: (r.failed_count, self.fails[r.id])
            for r in rows
            if r.operation not in ("two_waits", "batch_waits")
            and r.failed_count > self.fails[r.id] + (r.id in self.poisoned)
        }
        assert not over, f"failures counted beyond the calls' (counted, injected): {over}"

    @invariant()
    def each_transition_confirmed_under_its_own_id(self) -> None:
        """A receiver dedups by the webhook id: two transitions (a message FAILED, restarted, FAILED again)
        never share one (issue 26 #6); the retries of one share it."""
        shared = {key: seen for key, seen in routes.DELIVERIES.items() if len(seen) > 1}
        assert not shared, f"transitions confirmed under one webhook id: {shared}"

    @invariant()
    def each_transition_confirmed_once(self) -> None:
        """The confirmer (`routes.confirm`) ended successfully once per webhook id: no sender took over a
        confirmation another still sent (issue 33 #7: a confirmer outlasting its sending lease)."""
        twice = {wid: n for wid, n in Counter(routes.CONFIRM_CALLS).items() if n > 1}
        assert not twice, f"confirmations made twice: {twice}"

    @invariant()
    def the_protocol_confirms_each_transition_once_signed(self) -> None:
        """PROTO's endpoint accepted each confirmation once, signed with its secret, one transition per webhook id."""
        with self.receiver.lock:
            accepted = list(self.receiver.accepted)
            unsigned = list(self.receiver.unsigned)
        assert not unsigned, f"confirmations not signed with PROTO's secret: {unsigned}"
        twice = {wid: n for wid, n in Counter(wid for wid, _, _ in accepted).items() if n > 1}
        assert not twice, f"confirmations accepted twice: {twice}"

    @invariant()
    def a_sync_result_is_its_last_calls(self) -> None:
        """Every p.sync message that ended OK holds a result, and it is the one its last step's call gave: that
        call succeeded, once (a second success of its key is `no_successful_call_made_twice`'s)."""
        with transaction() as conn:
            rows = conn.execute(
                select(messages.c.id, messages.c.result).where(messages.c.operation == "sync", messages.c.state == "OK")
            ).all()
        made = {k for step, k in routes.CALLS if step == "quote"}
        for row in rows:
            result = openhub.get_message(row.id).result
            assert isinstance(result, dict) and result.get("message") == row.id, f"message {row.id}: {result!r}"
            assert result["key"] in made, f"message {row.id}'s result names no call made: {result!r}"

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
        # One query for every split (a query per split made the check grow with the messages, after every rule).
        children = select(messages.c.id).where(messages.c.parent_id == ext_calls.c.message_id)
        with transaction() as conn:
            childless = (
                conn.execute(
                    select(ext_calls.c.message_id).where(
                        ext_calls.c.step_key.in_(("many", "hooked_many", "unbound_many")),
                        ext_calls.c.state == "OK",
                        ~children.exists(),
                    )
                )
                .scalars()
                .all()
            )
        assert not childless, f"messages whose split was recorded OK without children: {childless}"

    @invariant()
    def a_sequential_family_calls_in_order(self) -> None:
        """The children of a sequential split made their first calls one after another, in their order."""
        family: dict[int, list[tuple[int, int]]] = {}
        with transaction() as conn:
            parents = select(messages.c.id).where(messages.c.operation == "sequence")
            for r in conn.execute(
                select(messages.c.id, messages.c.parent_id, ext_calls.c.id.label("call"))
                .join(ext_calls, ext_calls.c.message_id == messages.c.id)
                .where(messages.c.parent_id.in_(parents))
            ):
                family.setdefault(r.parent_id, []).append((r.call, r.id))
        for parent, calls in family.items():
            by_call = [child for _, child in sorted(calls)]
            assert by_call == sorted(by_call), f"sequential children of {parent} called out of order: {by_call}"

    @invariant()
    def a_message_submitted_in_a_transaction_exists_iff_its_order_does(self) -> None:
        """The caller's row and the message commit or roll back together (issue 37, part 1)."""
        with transaction() as conn:
            orders = set(conn.execute(select(ORDERS.c.id)).scalars())
            stored = set(
                conn.execute(
                    select(messages.c.correlation_id).where(  # (not a message named like one's child)
                        messages.c.correlation_id.in_(list(self.orders)), messages.c.parent_id.is_(None)
                    )
                ).scalars()
            )
        assert orders == stored == {o for o, ends in self.orders.items() if ends != "rollback"}, (
            orders,
            stored,
            self.orders,
        )
        rolled = [o for o, ends in self.orders.items() if ends == "rollback"]
        with transaction() as conn:  # nor any fan-out receiver of one rolled back
            left = conn.execute(
                select(messages.c.correlation_id).where(
                    messages.c.parent_id.is_not(None),
                    messages.c.correlation_id.in_([f"{o}#0.{n}" for o in rolled for n in (1, 2, 3)]),
                )
            ).all()
        assert not left, f"receivers of rolled-back submits: {left}"

    @invariant()
    def a_message_retried_for_ever_fails_only_by_a_verdict(self) -> None:
        """p.forever (`RetryPolicy(max_fails=None)`) ends FAILED only by a rejected call or a poison run, never
        by failures counted (issue 37, part 4)."""
        with transaction() as conn:
            failed = conn.execute(
                select(messages.c.id, messages.c.failed_count).where(
                    messages.c.operation == "forever", messages.c.state == "FAILED"
                )
            ).all()
        wrong = [r.id for r in failed if r.id not in self.rejected | self.poisoned]
        assert not wrong, f"messages retried for ever ended FAILED by their failures: {wrong}"

    @invariant()
    def an_unbound_parent_never_waits_for_its_children(self) -> None:
        """A parent of independent children (issue 37, part 5) is never WAITING for them, and none of their
        ends makes it fail: it fails only by its own calls."""
        with transaction() as conn:
            parents = conn.execute(
                select(messages.c.id, messages.c.state, messages.c.failed_error).where(
                    messages.c.operation == "unbound"
                )
            ).all()
        assert not [p.id for p in parents if p.state == "WAITING"], parents
        assert not [p.id for p in parents if p.state == "FAILED" and "child" in (p.failed_error or "")], parents

    @invariant()
    def a_family_is_its_receivers_and_each_its_own(self) -> None:
        """A topic's message (issue 37, part 2) is OK from its accept, with one receiver per subscribed route
        written with it, never more (no restart adds one); an operator action on a receiver (or on the family,
        refused) changes no other message: a receiver cancelled or restarted is one an action named."""
        with transaction() as conn:
            families = dict(
                conn.execute(
                    select(messages.c.id, messages.c.state).where(
                        messages.c.service == "p", messages.c.operation == "published", messages.c.parent_id.is_(None)
                    )
                ).all()
            )
            members = conn.execute(
                select(messages.c.id, messages.c.parent_id, messages.c.service, messages.c.operation).where(
                    messages.c.parent_id.in_(list(families))
                )
            ).all()
            touched = set(
                conn.execute(
                    select(transitions.c.message_id).where(
                        transitions.c.message_id.in_([m.id for m in members] + list(families)),
                        transitions.c.event.in_(("cancelled", "restarted")),
                    )
                ).scalars()
            )
        assert all(state == "OK" for state in families.values()), families
        got: dict[int, list[str]] = {family: [] for family in families}
        for m in sorted(members, key=lambda m: m.id):
            got[m.parent_id].append(f"{m.service}.{m.operation}")
        wrong = {family: names for family, names in got.items() if names != list(routes.RECEIVERS)}
        assert not wrong, f"families whose receivers are not the topic's subscribers: {wrong}"
        assert touched <= self.acted - set(families), (
            f"messages cancelled or restarted by no action: {touched - self.acted}"
        )

    def skew_this_hosts_clock(self, seconds: float) -> None:
        """(Regression examples, PostgreSQL.) This host's wall clock is `seconds` off, the database's right (issue
        33 #4): what the hub reads of its host's clock (`openhub.store.db.utcnow`) from now on; this process's
        heartbeat is written again, as its next beat would be."""
        from openhub.store import db
        from openhub.store.workers import beat, current_id

        real = db.datetime

        class Skewed(real):  # type: ignore[valid-type,misc]
            @classmethod
            def now(cls, tz: Any = None) -> Any:
                return real.now(tz) + timedelta(seconds=seconds)

        db.datetime = Skewed  # type: ignore[misc]
        self.undo.append(lambda: setattr(db, "datetime", real))
        beat(current_id(), "LocalHub", get_settings().database_url)

    def stored_times_on_the_databases_clock(self) -> None:
        """(Regression examples.) On PostgreSQL every time the hub stored (messages, history, heartbeats) is the
        database's clock's (plus the model's time ahead), whatever this host's clock says (issue 33 #4, #3)."""
        with transaction() as conn:
            if not is_postgres(conn):
                return
            now = conn.execute(sa.text("SELECT timezone('UTC', clock_timestamp())")).scalar_one()
            latest = {
                "messages.updated_at": conn.execute(select(sa.func.max(messages.c.updated_at))).scalar_one(),
                "transitions.at": conn.execute(select(sa.func.max(transitions.c.at))).scalar_one(),
                "workers.last_seen": conn.execute(select(sa.func.max(workers.c.last_seen))).scalar_one(),
            }
        ahead = {
            name: (at - now).total_seconds() - self.minutes * 60
            for name, at in latest.items()
            if at is not None and (at - now).total_seconds() - self.minutes * 60 > 5
        }
        assert not ahead, f"times stored ahead of the database's clock (seconds): {ahead}"

    def confirmer_outlasts_its_lease(self, leases: int) -> None:
        """(Regression examples, with a short sending lease: `tuned`.) The next confirmation's confirmer runs
        `leases` times the sending lease (real time: the lease is renewed by a thread while it runs), while
        poller ticks go on beside it, at the model's time: none takes the confirmation over."""
        from tests.support.waiting import wait_for

        lease = confirmation_lease(get_settings()).total_seconds()

        def hook(outcome: Any) -> None:
            routes.HOOKS.pop("confirm", None)
            until, ticks = time.monotonic() + leases * lease, []

            def ticked_past_the_lease() -> bool:
                self._tick()
                ticks.append(1)
                return time.monotonic() >= until and len(ticks) >= 3

            wait_for(ticked_past_the_lease, leases * lease + 30, "ticks beside the confirmer past its lease")

        routes.HOOKS["confirm"] = hook

    def crash_beside_a_second_hub(self, route: str) -> None:
        """(Regression examples.) A message's worker dies mid-call while a second hub is open in this process
        (issue 35: installed last, its store the process's default): the crash is noted in this hub's own store,
        where its next tick finds the run lost (`tick_repairs_every_lost_run`)."""
        from openhub.testing import LocalHub

        with LocalHub(routes.__name__, source_system="CONFIRMED"):
            self.submit_and_interrupt(route, "crash", "self", False)

    def cancel_as_a_step_is_entered_beside_another_delivery(self, route: str, step: str) -> None:
        """(Regression examples, PostgreSQL: chain mode's single statement.) A message's `step` (not its route's
        first) is entered in one statement that takes its lease, while another delivery of the step's task had
        inserted the step's call record in between (its worker then died before the call's outcome): the
        statement took the lease without the record, and an operator cancels the message before the entry's
        transaction that reads the record (issue 42's review). That entry must see the lease lost and stop: the
        cancel stays, and no call of the message begins after it (`no_call_begun_after_its_cancel`)."""
        from openhub.engine import leases

        take_new = leases.take_new
        target: list[int] = []
        raced_at: list[int] = []

        def raced(conn: Any, run: Any, columns: Any, now: Any) -> tuple[Any, bool]:
            row, inserted = take_new(conn, run, columns, now)
            if raced_at or row is None or not inserted or run.message_id not in target or run.item.key != step:
                return row, inserted
            raced_at.append(run.message_id)
            # The record is there as the other delivery inserted it (PROCESSING, this message's, attempt 1);
            # the operator's cancel commits before this run's next transaction.
            self._act("cancel", run.message_id)
            return row, False

        leases.take_new = raced
        try:
            self._run()
            self.submit(route)
            target.append(self.ids[-1])
            self._run(limit=1)
        finally:
            leases.take_new = take_new
        assert raced_at, f"no single statement took the lease of {route}'s step {step}"

    def heartbeat_gap_ends_as_a_lease_is_answered(self, route: str, step: str) -> None:
        """(Regression examples, PostgreSQL: chain mode's single statement.) This process's heartbeat had fallen
        behind (a stall, the store away) and comes back while the answer to the single statement that took a
        message's `step` lease travels: the statement committed on the server, and during the gap the other
        workers judged this process dead (a witness kept heartbeating past OPENHUB_WORKER_DEAD_AFTER after its
        last heartbeat) and their poller repaired the run; the repaired chain runs at once, beside this run (as
        `arm_in_flight(nested=True)` runs chains), and calls the step. This run, whose lease was taken before the
        gap ended, is fenced (`workers.fenced`: its start read before the statement was sent) and calls nothing:
        the step's key sees one successful call (`no_successful_call_made_twice`)."""
        from sqlalchemy import event

        from openhub.engine import poller
        from openhub.store import db
        from openhub.store import workers as beats

        url = get_settings().database_url
        engine = db.get_engine(url)
        # The lease statements of chain mode's single statement (autocommit): the route's first step's claim
        # (`batch_claims.claim_all`), a later step's lease with its first call record (`leases.take_new`).
        lease_of = "WITH v AS" if get_registry().route(route).steps[0].key == step else "WITH lease AS"
        saved = (beats._beating, beats._renewed, beats._gap_ended)
        seen: list[bool] = []

        def restore() -> None:
            beats._beating, beats._renewed, beats._gap_ended = saved
            if event.contains(engine, "after_cursor_execute", answered):
                event.remove(engine, "after_cursor_execute", answered)

        def answered(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if seen or not conn.connection.dbapi_connection.autocommit or not statement.lstrip().startswith(lease_of):
                return
            seen.append(True)
            # The gap ends now: this process heartbeats (as a worker does), its heartbeat fresh again. What
            # follows happened during the gap, on the other workers: the chain they repaired runs here, but
            # begun after the gap's end, this process's gap does not fence it (as it does not another's).
            beats._beating, beats._renewed = os.getpid(), time.monotonic()
            beats._gap_ended = time.monotonic()
            me = beats.current_id()
            dead_after = get_settings().worker_dead_after
            # The gap as the store saw it (the database's times): this process's last heartbeat before it,
            # and another worker, up since then, that heartbeat on for dead-after: to it this process is dead.
            last = store_now() - dead_after - timedelta(seconds=1)
            with transaction() as tx:
                tx.execute(
                    update(workers)
                    .where(workers.c.id == me)
                    .values(last_seen=last, up_since=sa.func.least(workers.c.up_since, last))
                )
                tx.execute(
                    sa.insert(workers).values(
                        id=str(uuid.uuid4()),
                        node="witness:1",
                        parent="witness:0",
                        up_since=last,
                        last_seen=last + dead_after + timedelta(seconds=1),
                        runs="#0",
                    )
                )
            # Its poller repairs the run (a new token, the chain published again), as its tick would.
            poller.tick(self.hub.hub, store_now() + timedelta(minutes=self.minutes))
            # This process's heartbeat is written again (the gap's end, as the store sees it): alive to all.
            beats.beat(me, "LocalHub", url)
            self._run()  # the repaired chain, on another worker (here: beside this run)

        event.listen(engine, "after_cursor_execute", answered)
        self.undo.append(restore)
        try:
            self._run()
            self.submit(route)
            self._run(limit=1)
        finally:
            restore()
        assert seen, f"no single statement took the lease of {route}'s step {step}"

    def tick_repairs_every_lost_run(self, page: int) -> None:
        """(Regression examples.) One tick, its lost-run repair reading `page` rows a transaction (the poller's
        BATCH, 500, lowered so that a few lost runs fill more than one page): every run lost before it is
        repaired by that one tick and run on, none left leased to a dead worker."""
        from openhub.engine import poller

        saved = poller.BATCH
        poller.BATCH = page
        try:
            self._end_dead_leases(self.minutes * 60)
            self.hub.tick(seconds=self.minutes * 60)
        finally:
            poller.BATCH = saved
        with transaction() as conn:
            leased = (
                conn.execute(
                    select(messages.c.id).where(messages.c.worker.is_not(None), messages.c.step_run.is_not(None))
                )
                .scalars()
                .all()
            )
        assert not leased, f"runs left leased after a tick repaired the lost ones: {leased}"

    @rule()
    def settle(self) -> None:
        """With no more faults and enough time (up to 32 quiet hours), every message ends (or waits for its answer).

        Quiet hours under the retry settings' own values: the admin's live ones are forgotten first. Under a live
        OPENHUB_MAX_FAILS of 600 a message whose answer never comes (p.two_waits) times out and is tried again
        600 times, PARTLY_FAILED between a timeout and its retry: not final after 32 hours, by design."""
        routes.HOOKS.clear()
        for name in sorted(self.live):
            live_settings.unset_setting(name, hub=self.hub.hub)
        self.live.clear()
        self._act("drain_undrain", 0)
        for _ in range(16):  # a poison message's runs are lost until OPENHUB_MAX_LOST_RUNS (5) ends it FAILED
            self.minutes += 120
            self._tick()
            stuck = {
                v.id: v.state
                for v in openhub.list_messages(limit=1000)
                if v.state not in FINAL_STATES and v.state != "WAITING_FOR_RES"
            }
            if not stuck:
                break
        assert not stuck, f"messages not final after 32 quiet hours: {stuck}"
        self.receiver.failing = 0
        self.minutes += 120
        self._tick()  # the protocol's due confirmations are sent
        # What the source system was told of: its messages, and for a topic's message (a family, itself not
        # confirmed) each of its receivers, whose ids the accept answered with.
        families = select(messages.c.id).where(messages.c.operation == "published", messages.c.parent_id.is_(None))
        with transaction() as conn:
            final = {
                (r.id, r.state)
                for r in conn.execute(
                    select(messages.c.id, messages.c.state).where(
                        messages.c.source_system == "PROTO",
                        sa.or_(
                            sa.and_(messages.c.parent_id.is_(None), messages.c.id.not_in(families)),
                            messages.c.parent_id.in_(families),
                        ),
                        messages.c.state.in_(FINAL_STATES - {"SKIPPED"}),
                    )
                )
            }
        with self.receiver.lock:
            told = {(message, state) for _, message, state in self.receiver.accepted}
        assert final <= told, f"final PROTO messages never confirmed by the protocol: {final - told}"
        with transaction() as conn:  # no sender is left: none may still hold a confirmation
            sending = conn.execute(
                select(confirmations.c.message_id, confirmations.c.claim).where(confirmations.c.state == "SENDING")
            ).all()
        assert not sending, f"confirmations left SENDING with no sender after 32 quiet hours: {sending}"
