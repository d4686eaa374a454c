"""The promise model's process part (issue 33, item 7): what the in-process model (tests/support/promise_model.py,
a LocalHub) cannot have, with real ones.

Real `celery -A tasks worker` processes (prefork and gevent) on a private redis-server and a PostgreSQL
database of their own, each with its real heartbeat thread and fence; the model's own poller (a hub on that
store with its own OPENHUB_WORKER_DEAD_AFTER, publishing to that broker, ticked by the model) beside a second
hub with another dead-after, installed in this process after it; a TCP proxy in front of PostgreSQL for the
workers that reach the store through it. The model's actions are faults of those: a process stopped
(SIGSTOP) past dead-after and let go on (SIGCONT), a worker killed mid-call, every heartbeat held in the
store (its table locked) while the store answers the rest, one worker's link to the store cut (blackholed)
or away for a moment (reset and refused), Redis restarted empty, and, inside a worker's processes
(tests/support/worker_faults.py, one of the model's route modules), the heartbeat's own connection slow to open
(a loaded box) and the broker's empty answer to a read for tasks late. Each fault is recorded with its processes
and its time (CLOCK_MONOTONIC, shared by every process of the machine), and the checks read the external
system's calls (each says which process made it and when it passed the fence: tests/support/routes.call)
and the store:

1. every message ends (the model's hub ticking: a dead worker's runs repaired in seconds);
2. each step's call is made once per idempotency key, unless an earlier call of that key was in flight in a
   process when the model stopped, killed or cut that process, or passed the fence before the cut (README: a
   call in flight when its worker was judged dead is made again, with the same key) -- a call started after
   its process came back is not;
3. the fence: no call passes it in a process whose heartbeat has been held for more than CALL_FENCE of
   dead-after, nor in one whose way to the store has been cut for more than PROOF_AGE;
4. a fault of the hub's own is no failure of the message (failed_count 0; these schedules fail no call),
   and no run is repaired as lost (lease_expired) but in a process the model stopped, killed or cut;
5. no worker exits that the model did not kill;
6. no call refused by the fence (its lease let go as FENCED: "this process's heartbeat fell behind") but of a
   message whose run a fault that holds a heartbeat back (a stop, every heartbeat held, a cut, the store away)
   found in its process's hands, or while such a fault is on (and dead-after after it): a live process whose
   store answers refuses none of its own work.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from openhub.core.config import Settings
from openhub.core.states import FINAL, Event
from openhub.engine.hub import Hub
from openhub.engine.poller import tick
from openhub.external_system import Call
from openhub.service.messages import submit_many
from openhub.service.reads import get_message
from openhub.store.db import transaction
from openhub.store.proof import PROOF_AGE
from openhub.store.schema import messages, transitions, workers
from openhub.store.workers import CALL_FENCE
from openhub.testing import ExternalSystem, LocalHub
from tests.support import backends
from tests.support.tcpproxy import TcpProxy
from tests.support.waiting import wait_for
from tests.support.worker_faults import BROKER_READ_TIMEOUT, SLOW_HEARTBEAT_OPEN
from tests.support.workers import Worker

M, T, W = messages.c, transitions.c, workers.c
ROUTES = "tests.support.routes,tests.support.cpu_routes,tests.support.worker_faults"
EPSILON = 0.05  # seconds: what one process's monotonic reading may trail another's on one machine (none; to be safe)
# Faults that let a call in flight in the process they hit be made again (README), and a run be repaired as lost.
LOSES_RUNS = ("stall", "kill", "cut")
# Faults that hold a process's heartbeat back, so that its fence may refuse a call (check 6).
HOLDS_HEARTBEATS = ("stall", "held", "cut", "outage")


@dataclass
class Fault:
    kind: str  # stall, kill, held (every heartbeat held in the store), cut, outage, redis, slow_open
    pids: frozenset[int] | None  # the processes it hit (None: every one)
    start: float  # monotonic
    end: float = float("inf")
    messages: frozenset[int] = frozenset()  # the messages whose runs its processes held when it hit

    def hits(self, pid: int | None) -> bool:
        return self.pids is None or pid in self.pids


@dataclass
class ProcessModel:
    tmp_path: Path
    dead_after: float
    external: ExternalSystem = field(default_factory=ExternalSystem)
    faults: list[Fault] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    killed: list[Worker] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"/pm{uuid.uuid4().hex[:8]}")
    # wall clock minus monotonic: the store's times (naive UTC, its server's clock on this machine) as the faults'
    wall: float = field(default_factory=lambda: time.time() - time.monotonic())

    # --- the model's world ---------------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[ProcessModel]:
        saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
        self.external.start()
        env = {
            "OPENHUB_TEST_EXTERNAL_URL": self.external.url,
            "OPENHUB_WORKER_DEAD_AFTER": str(self.dead_after),
            "OPENHUB_ROUTES": ROUTES,
            "OPENHUB_LEASE_GRACE": "600",  # what is repaired here is repaired by liveness, not by a lease's expiry
        }
        try:
            with backends.backend("redis-pg", self.tmp_path / "store", env) as b, ExitStack() as stack:
                self.backend = b
                self.url = b.database_url
                self.proxy = TcpProxy(_host_port(self.url))
                # The model's poller: a hub on the workers' store and broker, its own dead-after.
                self.hub = Hub.build(Settings.from_env(b.env))
                # A second hub in this process, installed after it with another dead-after (issue 35): the
                # process's settings are its, never the first's.
                stack.enter_context(LocalHub("tests.support.routes", OPENHUB_WORKER_DEAD_AFTER="3600"))
                try:
                    yield self
                finally:
                    for w in self.workers:
                        if w not in self.killed:
                            w.kill()
        finally:
            self.external.stop()
            backends.activate(saved)

    def start_worker(
        self,
        pool: str = "prefork",
        concurrency: int = 1,
        *,
        via_proxy: bool = False,
        queues: str | None = None,
        slow_heartbeat_open: float | None = None,
        broker_read_timeout: float | None = None,
    ) -> Worker:
        """A worker; `slow_heartbeat_open`: in each of its processes, the heartbeat's own connection to the store
        takes that many seconds to open (the first time; tests/support/worker_faults.py), a fault recorded
        with its processes that holds no heartbeat back; `broker_read_timeout`: its outstanding read for
        tasks is answered empty after that many seconds, not 1 (the same module)."""
        env = dict(self.backend.env)
        if via_proxy:
            env["OPENHUB_DATABASE_URL"] = _through(self.proxy, self.url)
        if slow_heartbeat_open is not None:
            env[SLOW_HEARTBEAT_OPEN] = str(slow_heartbeat_open)
        if broker_read_timeout is not None:
            env[BROKER_READ_TIMEOUT] = str(broker_read_timeout)
        start = time.monotonic()
        worker = Worker(env, self.tmp_path, beat=False, concurrency=concurrency, pool=pool, queues=queues)
        worker.start()
        self.workers.append(worker)
        if slow_heartbeat_open is not None:
            assert worker.process is not None
            self.faults.append(Fault("slow_open", frozenset([worker.process.pid, *worker.child_pids()]), start))
        return worker

    # --- actions ---------------------------------------------------------------------------------------------

    def submit(self, route: str, n: int = 1, **payload: Any) -> list[int]:
        views = submit_many(
            [
                {
                    "route": route,
                    "payload": {"prefix": self.prefix, "n": i, **payload},
                    "source_system": "CRM",
                    "correlation_id": f"pm-{uuid.uuid4().hex}",
                }
                for i in range(n)
            ],
            hub=self.hub,
        )
        ids = [v.id for v in views]
        self.ids += ids
        return ids

    def path(self, step: str) -> str:
        return f"{self.prefix}/{step}"

    def leased(self, message_id: int, timeout: float = 30) -> tuple[str, int]:
        """Wait until the message's step is leased; its worker id and that process's pid."""

        def holder() -> tuple[str, int] | None:
            with transaction(self.url) as conn:
                row = conn.execute(select(M.worker, M.step_run).where(M.id == message_id)).first()
                if row is None or row.worker is None or row.step_run is None:
                    return None
                node = conn.execute(select(W.node).where(W.id == row.worker)).scalar()
            return (row.worker, int(node.rpartition(":")[2])) if node else None

        return wait_for(holder, timeout, f"message {message_id}'s step leased")

    def call_started(self, step: str, timeout: float = 30) -> Call:
        """Wait until a call of `step` began at the external system; the first one."""
        path = self.path(step)
        wait_for(lambda: self.external.started_events[path].is_set(), timeout, f"a call of {path}")
        with self.external._lock:
            return next(
                Call(p, None, None, 0, 0.0, 0.0, False, headers) for p, headers in self.external.started if p == path
            )

    def held_by(self, pids: frozenset[int] | None) -> frozenset[int]:
        """The messages whose runs these processes (None: any process) hold now."""
        with transaction(self.url) as conn:
            nodes = {r.id: r.node for r in conn.execute(select(W.id, W.node))}
            rows = conn.execute(select(M.id, M.worker).where(M.worker.is_not(None))).all()
        return frozenset(
            r.id for r in rows if pids is None or int(nodes.get(r.worker, ":0").rpartition(":")[2]) in pids
        )

    def stall(self, pid: int) -> Fault:
        fault = Fault("stall", frozenset({pid}), time.monotonic(), messages=self.held_by(frozenset({pid})))
        os.kill(pid, signal.SIGSTOP)
        self.faults.append(fault)
        return fault

    def resume(self, fault: Fault) -> None:
        assert fault.pids is not None
        for pid in fault.pids:
            os.kill(pid, signal.SIGCONT)
        fault.end = time.monotonic()

    def kill(self, worker: Worker) -> Fault:
        assert worker.process is not None
        pids = frozenset([worker.process.pid, *worker.child_pids()])
        fault = Fault("kill", pids, time.monotonic(), messages=self.held_by(pids))
        worker.kill()
        self.killed.append(worker)
        self.faults.append(fault)
        return fault

    def worker_of(self, pid: int) -> Worker:
        for w in self.workers:
            if w.process is not None and (w.process.pid == pid or pid in w.child_pids()):
                return w
        raise AssertionError(f"no worker of the model runs process {pid}")

    @contextmanager
    def heartbeats_held(self, fresh: str | None = None) -> Iterator[Fault]:
        """Every process's heartbeat hangs in the store (its table locked) while the store answers everything
        else; `fresh`: a worker id whose next heartbeat is waited for first (its age is then the hold's)."""
        engine = create_engine(self.url, poolclass=NullPool)
        if fresh is not None:
            seen = self._last_seen(fresh)
            wait_for(lambda: self._last_seen(fresh) != seen, 10 * self.dead_after, "a heartbeat")
        conn = engine.connect()
        tx = conn.begin()
        conn.execute(text("LOCK TABLE workers IN EXCLUSIVE MODE"))
        fault = Fault("held", None, time.monotonic(), messages=self.held_by(None))
        self.faults.append(fault)
        try:
            yield fault
        finally:
            tx.rollback()
            fault.end = time.monotonic()
            conn.close()
            engine.dispose()

    def _last_seen(self, worker_id: str) -> Any:
        with transaction(self.url) as conn:
            return conn.execute(select(W.last_seen).where(W.id == worker_id)).scalar()

    def cut(self, worker: Worker) -> Fault:
        """The worker's link to the store blackholed (it reaches PostgreSQL through the proxy): for good."""
        assert worker.process is not None
        pids = frozenset([worker.process.pid, *worker.child_pids()])
        fault = Fault("cut", pids, time.monotonic(), messages=self.held_by(pids))
        self.proxy.blackhole()
        self.faults.append(fault)
        return fault

    @contextmanager
    def store_away(self, worker: Worker) -> Iterator[Fault]:
        """The store away for the worker (through the proxy) for the block: connections reset, refused."""
        assert worker.process is not None
        pids = frozenset([worker.process.pid, *worker.child_pids()])
        fault = Fault("outage", pids, time.monotonic(), messages=self.held_by(pids))
        self.proxy.outage()
        self.faults.append(fault)
        try:
            yield fault
        finally:
            self.proxy.restore()
            fault.end = time.monotonic()

    def restart_redis(self, down: float) -> None:
        assert self.backend.redis is not None
        fault = Fault("redis", None, time.monotonic())
        self.backend.redis.restart(down=down)
        fault.end = time.monotonic()
        self.faults.append(fault)

    def tick(self) -> Any:
        return tick(self.hub)

    def history(self, message_id: int) -> list[tuple[str, str | None]]:
        with transaction(self.url) as conn:
            return [
                (r.event, r.detail)
                for r in conn.execute(select(T.event, T.detail).where(T.message_id == message_id).order_by(T.id))
            ]

    def settle(self, timeout: float) -> None:
        """Tick the model's hub until every message ended (the first check)."""

        def ended() -> bool:
            self.tick()
            return all(get_message(i, hub=self.hub).state in FINAL for i in self.ids)

        try:
            wait_for(ended, timeout, "every message to end", interval=0.2)
        except AssertionError:
            states = {i: get_message(i, hub=self.hub).state for i in self.ids}
            raise AssertionError(
                f"not every message ended within {timeout} s: {states}; histories: "
                f"{ {i: self.history(i) for i, s in states.items() if s not in FINAL} }; faults: {self.faults}; "
                f"logs: {[w.log()[-1500:] for w in self.workers]}"
            ) from None

    # --- checks ----------------------------------------------------------------------------------------------

    def check(self) -> None:
        problems = (
            self.calls_made_once()
            + self.fenced_calls()
            + self.own_faults_counted()
            + self.workers_exited()
            + self.refused_by_the_fence()
        )
        assert not problems, "\n".join(problems) + f"\nfaults: {self.faults}"

    def calls_made_once(self) -> list[str]:
        """2. A call made again is explained only by a fault that hit its earlier call in flight, in its process."""
        by_key: dict[tuple[str, str | None], list[Call]] = defaultdict(list)
        with self.external._lock:
            calls = [c for c in self.external.calls if c.path.startswith(self.prefix + "/")]
        for c in calls:
            by_key[(c.path, c.key)].append(c)
        problems = []
        for (path, key), made in by_key.items():
            made.sort(key=lambda c: c.started)
            for i, again in enumerate(made[1:], 1):
                if not any(self._hit_in_flight(earlier) for earlier in made[:i]):
                    problems.append(
                        f"{path} called again with key {key} (process {_pid(again)} at {again.started:.3f}); "
                        f"no fault hit an earlier call in flight: {[(_pid(c), c.started, c.ended) for c in made]}"
                    )
        return problems

    def _hit_in_flight(self, call: Call) -> bool:
        """Whether a fault of its process hit the call's run before its outcome was written: the call in
        flight at a stop, a kill or a cut; or, for a cut, passed the fence before it (its outcome's write, or
        the call itself, on the cut link)."""
        for f in self.faults:
            if f.kind not in LOSES_RUNS or not f.hits(_pid(call)):
                continue
            if call.started <= f.start + EPSILON and f.start < call.ended:
                return True
            if f.kind == "cut" and _passed(call) <= f.start + PROOF_AGE + EPSILON:
                return True
        return False

    def fenced_calls(self) -> list[str]:
        """3. No call passes the fence in a process whose heartbeat is held past CALL_FENCE of dead-after, nor
        in one cut from the store past PROOF_AGE."""
        problems = []
        with self.external._lock:
            calls = [c for c in self.external.calls if c.path.startswith(self.prefix + "/")]
        for c in calls:
            passed = _passed(c)
            for f in self.faults:
                bound = {"held": CALL_FENCE * self.dead_after, "cut": PROOF_AGE}.get(f.kind)
                if bound is not None and f.hits(_pid(c)) and f.start + bound + EPSILON < passed < f.end:
                    problems.append(
                        f"{c.path} (key {c.key}) passed the fence {passed - f.start:.2f} s into a '{f.kind}' fault "
                        f"of its process {_pid(c)} (bound {bound:.2f} s)"
                    )
        return problems

    def own_faults_counted(self) -> list[str]:
        """4. No failure counted, no run repaired as lost but where the model stopped, killed or cut its process."""
        licensed = set().union(*[f.messages for f in self.faults if f.kind in LOSES_RUNS])
        problems = []
        for i in self.ids:
            view = get_message(i, hub=self.hub)
            if view.failed_count:
                problems.append(f"message {i} counted {view.failed_count} failure(s): {self.history(i)}")
            lost = [d for e, d in self.history(i) if e == "lease_expired"]
            if lost and i not in licensed:
                problems.append(f"message {i}'s run repaired as lost, its process neither stopped nor killed: {lost}")
        return problems

    def workers_exited(self) -> list[str]:
        """5. No worker the model did not kill exited, or is on its way out: Celery's "Unrecoverable error" (a
        crash of its consumer) starts a shutdown that can outlast the settling, when the process is still there
        (after another schedule's Redis restarts, in one pytest run: the break of issue 33 #8 went unseen)."""
        return [
            f"worker {w.name} exited ({w.process.returncode}): {w.log()[-2000:]}"
            for w in self.workers
            if w not in self.killed
            and w.process is not None
            and (w.process.poll() is not None or "Unrecoverable error" in w.log())
        ]

    def refused_by_the_fence(self) -> list[str]:
        """6. A call refused by the fence (its lease let go as FENCED) is explained by a fault that holds a
        heartbeat back: one that found the message's run in its process's hands, or one on at the refusal (or
        ended less than dead-after before it: the gap fences the runs leased before it ends)."""
        holding = [f for f in self.faults if f.kind in HOLDS_HEARTBEATS]
        with transaction(self.url) as conn:
            rows = conn.execute(
                select(T.message_id, T.at, T.detail).where(
                    T.message_id.in_(self.ids), T.event == Event.LEASE_DROPPED.value
                )
            ).all()
        problems = []
        for r in rows:
            at = r.at.replace(tzinfo=timezone.utc).timestamp() - self.wall  # monotonic
            if not any(
                r.message_id in f.messages or f.start - EPSILON <= at <= f.end + self.dead_after + 1.0 for f in holding
            ):
                problems.append(
                    f"message {r.message_id}'s call refused by the fence at {at:.3f} with no fault holding a "
                    f"heartbeat back on: {r.detail}; history: {self.history(r.message_id)}"
                )
        return problems


def _passed(call: Call) -> float:
    """When the call passed its process's fence (tests/support/routes.call), monotonic."""
    return float(call.headers.get("x-test-passed", "nan"))


def _pid(call: Call) -> int | None:
    pid = call.headers.get("x-test-pid")
    return int(pid) if pid else None


def _host_port(url: str) -> tuple[str, int]:
    u = sqlalchemy.engine.make_url(url)
    return (u.host or "127.0.0.1", u.port or 5432)


def _through(proxy: TcpProxy, url: str) -> str:
    return sqlalchemy.engine.make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
