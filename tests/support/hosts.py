"""A hub spread over several "hosts" on this machine, and faults between them (issue 22).

Each host is a Linux network namespace joined to a bridge the rig creates (a private /24 under
10.231.0.0/16 that no address of this machine is in), running real `celery -A tasks worker`
processes (prefork, but the third host's on `-P gevent`, GEVENT_HOST); beat runs on the first host, the
HTTP API on the second. PostgreSQL, Redis and the
external system (openhub.testing.ExternalSystem) are private to the rig and listen on the bridge's
address (and 127.0.0.1, for the driver). A fault is made inside one namespace only: nftables rules
that drop its packets to PostgreSQL, to Redis, or 5 % of all; a slow link (tc netem's 200 ms where
the kernel has sch_netem, else a tbf rate limit whose queue delays); SIGSTOP of a worker for 40 s;
a kill and restart of its workers; its wall clock shifted by 90 s (tests/support/skewed_clock). One fault is
not in a namespace: Redis restarted empty (every host's broker connections cut, every queue lost). Each
fault says which host it hit and, for a kill or a stall, which processes (the checker explains a repeat
only by a fault on the process that made the call, tests/support/history.py).

Needs root and `ip netns`; `available()` says why not. Everything the rig made (namespaces, links,
processes, servers) is removed when its `with` block ends, however it ends.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy

from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.workers import PROJECT, Beat, Worker

SKEW_PATH = Path(__file__).resolve().parent / "skewed_clock"
# Short limits so that repairs happen within a test's patience, long enough that a 5 % lossy link
# does not look like a dead worker.
SETTINGS = dict(
    backends.TEST_SETTINGS,
    OPENHUB_WORKER_DEAD_AFTER="3",
    OPENHUB_LEASE_GRACE="4",
    OPENHUB_STEP_TIMEOUT="20",
    OPENHUB_MAX_FAILS="50",
    OPENHUB_CONFIRM_INTERVAL="0.5",
)
API_KEY = "hosts-rig-" + uuid.uuid4().hex  # 42 characters, as serve asks
SOURCE = "CONFIRMED"  # the source system with a confirmer (tests/support/routes.py)


def available() -> str | None:
    """Why the rig cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "the multi-host rig needs root (network namespaces)"
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"the multi-host rig needs `{tool}`"
    probe = f"ohprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (ip, nft, tc), raising with its stderr when `check` and it fails."""
    done = subprocess.run(list(args), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done


def _free_subnet() -> int:
    """A third octet n with 10.231.n.0/24 in no address or route of this machine."""
    used = sh("ip", "-4", "addr").stdout + sh("ip", "-4", "route").stdout
    for n in random.sample(range(1, 255), 254):
        if f"10.231.{n}." not in used:
            return n
    raise RuntimeError("no free 10.231.n.0/24")


@dataclass
class Host:
    """One namespace and the processes in it."""

    name: str
    ns: str
    ip: str
    link: str  # the link's name inside the namespace
    workdir: Path
    env: dict[str, str]
    concurrency: int = 2
    pool: str | None = None  # the worker's pool as -P names it (None: Celery's default, prefork)
    workers: list[Worker] = field(default_factory=list)
    others: list[Any] = field(default_factory=list)  # beat, API: processes that are not workers

    @property
    def skew_file(self) -> Path:
        return self.workdir / "clock-skew"

    def exec(self) -> list[str]:
        """The prefix that runs a command in this host."""
        return ["ip", "netns", "exec", self.ns]

    def process_env(self) -> dict[str, str]:
        """The environment of a process on this host: its clock may be shifted."""
        return dict(self.env, OPENHUB_TEST_SKEW_FILE=str(self.skew_file))

    @property
    def pythonpath(self) -> str:
        """The skewed clock's sitecustomize first, then the checkout."""
        return f"{SKEW_PATH}{os.pathsep}{PROJECT}"

    def start_worker(self) -> Worker:
        worker = Worker(
            self.process_env(),
            self.workdir,
            beat=False,
            concurrency=self.concurrency,
            name=f"{self.name}-{uuid.uuid4().hex[:4]}",
            pool=self.pool,
        )
        worker.env["PYTHONPATH"] = self.pythonpath
        worker.args = self.exec() + worker.args
        self.workers.append(worker)
        return worker.start()

    def start_beat(self) -> Beat:
        beat = Beat(self.process_env(), self.workdir)
        beat.env["PYTHONPATH"] = self.pythonpath
        beat.args = self.exec() + beat.args
        self.others.append(beat)
        return beat.start()

    def start_api(self, port: int) -> "Api":
        api = Api(self, port)
        self.others.append(api)
        return api.start()

    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.process is not None and w.process.poll() is None]

    def stop_all(self) -> None:
        for p in self.workers + self.others:
            try:
                os.killpg(p.process.pid, signal.SIGCONT)  # a stalled one must run to die warm
            except (AttributeError, ProcessLookupError):
                pass
            p.kill()

    # --- faults inside the namespace ----------------------------------------------------------
    def nft(self, table: str, rules: list[str]) -> None:
        """Add an nftables table of output/input rules in this host (replacing one of that name)."""
        self.drop_table(table)
        script = [
            f"table inet {table} {{",
            "  chain out { type filter hook output priority 0; policy accept;",
            *[f"    {r}" for r in rules if r.startswith("out ")],
            "  }",
            "  chain in { type filter hook input priority 0; policy accept;",
            *[f"    {r}" for r in rules if r.startswith("in ")],
            "  }",
            "}",
        ]
        script = [line.replace("    out ", "    ").replace("    in ", "    ") for line in script]
        path = self.workdir / f"{table}.nft"
        path.write_text("\n".join(script) + "\n")
        sh(*self.exec(), "nft", "-f", str(path))

    def drop_table(self, table: str) -> None:
        sh(*self.exec(), "nft", "delete", "table", "inet", table, check=False)


class Api:
    """`openhub serve` in a host."""

    def __init__(self, host: Host, port: int) -> None:
        self.host, self.port = host, port
        self.log_path = host.workdir / "api.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host.ip}:{self.port}"

    def start(self) -> "Api":
        env = dict(
            os.environ,
            **self.host.process_env(),
            OPENHUB_API_KEYS=f"{SOURCE}={API_KEY}",
            PYTHONPATH=self.host.pythonpath,
        )
        openhub = str(Path(sys.executable).parent / "openhub")
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            self.host.exec() + [openhub, "serve", "--host", self.host.ip, "--port", str(self.port), "--workers", "1"],
            env=env,
            cwd=PROJECT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"API exited: {self.log_path.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1)
                return self
            except OSError:
                time.sleep(0.1)  # polling until it answers
        raise RuntimeError("API did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class Rig:
    """The hosts, the servers they share, and what was done to them."""

    hosts: list[Host]
    gateway: str
    pg: backends.PostgresServer
    redis: backends.RedisServer
    external: ExternalSystem
    env: dict[str, str]  # the driver's own (127.0.0.1) view of the store and broker
    api: Api
    netem: bool  # whether the kernel has sch_netem (else a slow link is a tbf rate limit)

    def host_of(self, address: str | None) -> str | None:
        return next((h.name for h in self.hosts if h.ip == address), None)


# The host whose worker runs `-P gevent` (its steps, and a batch's members, as greenlets of one process: no
# pool processes, so a stall of "a pool process" there stops the whole worker), and its concurrency.
GEVENT_HOST = 3
GEVENT_CONCURRENCY = 50


@contextmanager
def rig(workdir: Path, hosts: int = 3, concurrency: int = 2, extra: dict[str, str] | None = None) -> Iterator[Rig]:
    """Build the rig in `workdir` (workers started, beat on the first host, the API on the second)."""
    from openhub.store.migrate import upgrade

    tag = uuid.uuid4().hex[:5]
    n = _free_subnet()
    gateway = f"10.231.{n}.1"
    bridge = f"ohb{tag}"
    with ExitStack() as stack:
        sh("ip", "link", "add", bridge, "type", "bridge")
        stack.callback(sh, "ip", "link", "del", bridge, check=False)
        sh("ip", "addr", "add", f"{gateway}/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        made: list[Host] = []
        for i in range(1, hosts + 1):
            ns, outside, inside = f"oh{tag}-h{i}", f"oh{tag}h{i}", "eth0"
            sh("ip", "netns", "add", ns)
            stack.callback(sh, "ip", "netns", "del", ns, check=False)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", f"{outside}n")
            stack.callback(sh, "ip", "link", "del", outside, check=False)
            sh("ip", "link", "set", f"{outside}n", "netns", ns)
            sh("ip", "-n", ns, "link", "set", f"{outside}n", "name", inside)
            sh("ip", "link", "set", outside, "master", bridge, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"10.231.{n}.{10 + i}/24", "dev", inside)
            sh("ip", "-n", ns, "link", "set", inside, "up")
            hdir = workdir / f"h{i}"
            hdir.mkdir(parents=True, exist_ok=True)
            host = Host(f"h{i}", ns, f"10.231.{n}.{10 + i}", inside, hdir, {}, concurrency)
            if i == GEVENT_HOST:  # one host's worker runs its steps (and batches) as greenlets
                host.pool, host.concurrency = "gevent", GEVENT_CONCURRENCY
            made.append(host)
        netem = (
            sh(
                "tc", "-n", made[0].ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms", check=False
            ).returncode
            == 0
        )
        sh("tc", "-n", made[0].ns, "qdisc", "del", "dev", "eth0", "root", check=False)

        external = ExternalSystem().start(host=gateway)
        stack.callback(external.stop)
        pg = backends.PostgresServer.start(also_on=gateway, clients=f"10.231.{n}.0/24")
        stack.callback(pg.remove)
        redis = backends.RedisServer.start(workdir / "redis", also_on=gateway)
        stack.callback(redis.stop)
        database = "openhub_hosts"
        admin = sqlalchemy.create_engine(f"{pg.url}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {database}")
        admin.dispose()
        local = dict(
            SETTINGS,
            **(extra or {}),
            OPENHUB_VAR_DIR=str(workdir / "var"),
            OPENHUB_TEST_EXTERNAL_URL=external.url,
            OPENHUB_DATABASE_URL=f"{pg.url}/{database}",
            OPENHUB_BROKER_URL=redis.url,
        )
        remote = dict(
            local,
            OPENHUB_DATABASE_URL=f"postgresql+psycopg://postgres@{gateway}:{pg.port}/{database}",
            OPENHUB_BROKER_URL=f"redis://{gateway}:{redis.port}/0",
        )
        backends.activate(local)
        upgrade(local["OPENHUB_DATABASE_URL"])
        for h in made:
            h.env = dict(remote)
            h.skew_file.write_text("0\n")
            stack.callback(h.stop_all)
        for h in made:
            h.start_worker()
        made[0].start_beat()
        api = made[min(1, len(made) - 1)].start_api(backends.free_port())
        yield Rig(made, gateway, pg, redis, external, local, api, netem)
        from openhub.store.db import dispose_engines

        dispose_engines()


# --- the fault driver -------------------------------------------------------------------------
KINDS = ["cut_pg", "cut_redis", "cut_both", "slow_link", "lossy_link", "stall", "kill", "skew", "restart_redis"]
BROKER = "redis"  # the "host" of a fault on the shared broker, not on one of the worker hosts


@dataclass
class Fault:
    """One fault on one host, from `start` to `end` (monotonic seconds), as the log shows it; `pids`: the
    processes a kill or a stall hit (None: the whole host)."""

    kind: str
    host: str
    start: float
    end: float | None = None
    detail: str = ""
    pids: list[int] | None = None

    def as_dict(self, origin: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "host": self.host,
            "at": round(self.start - origin, 1),
            "for": round((self.end or self.start) - self.start, 1),
            "detail": self.detail,
            "pids": self.pids,
        }


class FaultDriver:
    """Faults at random from `seed`, one at a time on one host, each for a bounded time."""

    STALL = 40.0  # a SIGSTOPped worker's stall: well past the dead-after limit

    def __init__(
        self,
        the_rig: Rig,
        seed: int,
        kinds: list[str] | None = None,
        longest: float = 30.0,
        calm: tuple[float, float] = (3.0, 10.0),
    ) -> None:
        self.rig, self.random = the_rig, random.Random(seed)
        self.kinds = kinds or KINDS
        self.longest, self.calm = longest, calm
        self.log: list[Fault] = []
        self._undo: list[Any] = []

    def run(self, seconds: float, stop: threading.Event | None = None, order: list[str] | None = None) -> None:
        """Inject faults for `seconds` (each kind of `order` first, in that order, then at random)."""
        stop = stop or threading.Event()
        deadline = time.monotonic() + seconds
        queue = list(order or [])
        while time.monotonic() < deadline and not stop.is_set():
            kind = queue.pop(0) if queue else self.random.choice(self.kinds)
            host = self.random.choice(self.rig.hosts)
            length = self.STALL if kind == "stall" else self.random.uniform(5.0, self.longest)
            if kind == "restart_redis":
                length = self.random.uniform(1.0, 3.0)  # how long Redis stays down
            length = min(length, max(deadline - time.monotonic(), 1.0)) if kind != "stall" else length
            fault = self.inject(kind, host, length)
            stop.wait(length)  # the fault's length is what is being injected
            self.heal(fault)
            stop.wait(self.random.uniform(*self.calm))

    def inject(self, kind: str, host: Host, length: float) -> Fault:
        fault = Fault(kind, BROKER if kind == "restart_redis" else host.name, time.monotonic())
        gw, pg, redis = self.rig.gateway, self.rig.pg.port, self.rig.redis.port
        ports = {"cut_pg": [pg], "cut_redis": [redis], "cut_both": [pg, redis]}
        if kind in ports:
            rules = []
            for port in ports[kind]:
                rules += [f"out ip daddr {gw} tcp dport {port} drop", f"in ip saddr {gw} tcp sport {port} drop"]
            host.nft("ohcut", rules)
            self._undo.append(lambda: host.drop_table("ohcut"))
        elif kind == "lossy_link":
            host.nft("ohloss", ["out numgen random mod 100 < 5 drop", "in numgen random mod 100 < 5 drop"])
            self._undo.append(lambda: host.drop_table("ohloss"))
        elif kind == "slow_link":
            if self.rig.netem:
                sh("tc", "-n", host.ns, "qdisc", "add", "dev", host.link, "root", "netem", "delay", "200ms")
                fault.detail = "netem delay 200ms"
            else:  # no sch_netem in this kernel: a narrow link whose queue delays every packet
                sh(
                    "tc",
                    "-n",
                    host.ns,
                    "qdisc",
                    "add",
                    "dev",
                    host.link,
                    "root",
                    "tbf",
                    "rate",
                    "256kbit",
                    "burst",
                    "4kb",
                    "latency",
                    "400ms",
                )
                fault.detail = "tbf rate 256kbit (no sch_netem here)"
            self._undo.append(lambda: sh("tc", "-n", host.ns, "qdisc", "del", "dev", host.link, "root", check=False))
        elif kind == "stall":
            victims = host.live_workers()
            if victims:
                worker = self.random.choice(victims)
                children = worker.child_pids()  # none under -P gevent: its pool is the worker itself
                whole = self.random.random() < 0.5 or not children
                pids = [worker.process.pid] if whole else children[:1]
                # the processes the stall stops: the whole worker is its pool too
                fault.pids = [worker.process.pid, *children] if whole else list(pids)
                if whole:
                    os.killpg(worker.process.pid, signal.SIGSTOP)
                else:
                    os.kill(pids[0], signal.SIGSTOP)
                fault.start = time.monotonic()
                fault.detail = f"{worker.name} {'whole worker' if whole else f'pool process {pids[0]}'}"

                def resume() -> None:
                    try:
                        if whole:
                            os.killpg(worker.process.pid, signal.SIGCONT)
                        else:
                            os.kill(pids[0], signal.SIGCONT)
                    except ProcessLookupError:
                        pass

                self._undo.append(resume)
        elif kind == "kill":
            fault.pids = [pid for w in host.live_workers() for pid in (w.process.pid, *w.child_pids())]
            fault.start = time.monotonic()
            for w in host.live_workers():
                w.kill()
            fault.detail = "SIGKILL every worker; restarted at the fault's end"
            self._undo.append(host.start_worker)
        elif kind == "skew":
            shift = self.random.choice([90, -90])
            host.skew_file.write_text(f"{shift}\n")
            fault.detail = f"wall clock {shift:+d} s"
            self._undo.append(lambda: host.skew_file.write_text("0\n"))
        elif kind == "restart_redis":
            # down for the fault's length, then up again empty: stop now, start in heal()
            self.rig.redis.stop()
            fault.detail = "redis-server stopped; started again empty at the fault's end"
            self._undo.append(lambda: self.rig.redis.restart())
        else:
            raise ValueError(kind)
        self.log.append(fault)
        return fault

    def heal(self, fault: Fault) -> None:
        while self._undo:
            self._undo.pop()()
        fault.end = time.monotonic()

    def heal_all(self) -> None:
        """Undo whatever is still in force (the driver was stopped mid-fault)."""
        if self.log and self.log[-1].end is None:
            self.heal(self.log[-1])


# --- traffic ----------------------------------------------------------------------------------
# (route, payload) kinds: a chain and a fused flow of three calls, a funnel, a funnel in guaranteed order,
# a split (a call, two children of one call each, a call after them; its own paths, to count the lines),
# and a batch route's flow of the same three calls (`Route(batch=20)`), BATCH_GROUP messages submitted
# together so that one batch task carries them through the steps in lockstep
GROUPS = 3
TRAFFIC_KINDS = ["chain", "fused", "funnel", "ordered", "split", "batch"]
BATCH_GROUP = 4
FUNNEL_PATHS = ["/funnel/ordered", "/ordered/ordered"]
FUNNEL_HOLD = 0.075  # seconds the external system takes over a funnel's call, so that an overlap shows


def payload(kind: str, n: int) -> tuple[str, dict[str, Any]]:
    if kind == "chain":
        return "test.flow", {"prefix": "/chain"}
    if kind == "fused":
        return "fused.flow", {"prefix": "/fused"}
    if kind == "batch":  # `n`: its request's first message (what it is published with: history.py's siblings)
        return "batched.flow", {"prefix": "/batch", "group": f"batch{n}"}
    if kind == "split":
        return "test.order", {"prefix": f"/split/{n}", "lines": [{"sku": 1}, {"sku": 2}]}
    group = f"{kind}{n % GROUPS}"
    route = "test.funnel" if kind == "funnel" else "test.ordered_x"
    return route, {"prefix": f"/{kind}", "group": group, "funnel_header": group}


class Traffic:
    """Submits batches through the API on the second host, retrying a refused batch as it was (a batch
    route's group of messages goes in one of them: submitted together, they are published as one task)."""

    def __init__(self, the_rig: Rig, rate: float, seed: int) -> None:
        self.rig, self.rate = the_rig, rate
        self.random = random.Random(seed)
        self.submitted: dict[str, dict[str, Any]] = {}  # correlation id -> {id, route, group, prefix, lines?}
        self.refused = 0
        self._n = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            batch = []
            first = self._n + 1  # the batch route's messages of this request are published together
            for _ in range(max(1, round(self.rate))):
                kind = self.random.choice(TRAFFIC_KINDS)
                for _ in range(BATCH_GROUP if kind == "batch" else 1):
                    self._n += 1
                    route, body = payload(kind, first if kind == "batch" else self._n)
                    correlation = f"hosts-{self._n:06d}"
                    batch.append(
                        {"route": route, "payload": body, "correlation_id": correlation, "source_system": SOURCE}
                    )
            while not self._send(batch) and not stop.is_set():
                stop.wait(0.5)  # the API or its store is away: the same batch again shortly
            stop.wait(1.0)

    def _send(self, batch: list[dict[str, Any]]) -> bool:
        request = urllib.request.Request(
            f"{self.rig.api.url}/api/v1/messages:batch",
            data=json.dumps({"messages": batch}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                views = json.loads(answer.read())["messages"]
        except OSError:
            self.refused += 1
            return False
        for item, view in zip(batch, views):
            self.submitted[item["correlation_id"]] = {
                "id": view["id"],
                "route": item["route"],
                "group": item["payload"].get("group"),
                "prefix": item["payload"]["prefix"],
            }
            if "lines" in item["payload"]:
                self.submitted[item["correlation_id"]]["lines"] = len(item["payload"]["lines"])
        return True


# --- one run: traffic under faults, then the checker ----------------------------------------------
def _states(ids: list[int]) -> dict[int, str]:
    from sqlalchemy import select

    from openhub.store.schema import messages
    from tests.support.process_store import transaction

    with transaction() as conn:
        return {
            r.id: r.state for r in conn.execute(select(messages.c.id, messages.c.state).where(messages.c.id.in_(ids)))
        }


def _unsettled(
    ids: list[int], confirmed: set[str], final: set[str], calls: list[Any], workdir: Path, limit: int = 20
) -> list[dict[str, Any]]:
    """What each message not yet final and confirmed shows in the store: its state, step and history's
    last entries, its confirmation's row with its claim and the store's time now, the confirmation calls the
    source system received, and the hosts' log lines about it (why a run did not settle)."""
    from sqlalchemy import select

    from openhub.store.schema import confirmations, messages
    from tests.support.process_store import store_now, transaction

    M, C = messages.c, confirmations.c
    out = []
    with transaction() as conn:
        rows = conn.execute(
            select(M.id, M.state, M.service, M.operation, M.due_at, M.step_run, M.failed_step)
            .where(M.id.in_(ids))
            .order_by(M.id)
        ).all()
        for r in rows:
            if r.state in final and f"{r.id}:{r.state}" in confirmed:
                continue
            conf = conn.execute(
                select(C.outcome, C.state, C.attempts, C.due_at, C.last_error, C.claim).where(C.message_id == r.id)
            ).all()
            out.append(
                {
                    "id": r.id,
                    "state": r.state,
                    "route": f"{r.service}.{r.operation}",
                    "due_at": str(r.due_at),
                    "step_run": r.step_run,
                    "confirmations": [[str(v)[:200] for v in c] for c in conf],
                    "store_now": str(store_now()),
                    "confirm_calls": [
                        (c.status, round(c.started, 1), c.peer) for c in calls if c.key == f"{r.id}:{r.state}"
                    ],
                    "log": _log_lines(workdir, r.id),
                }
            )
            if len(out) >= limit:
                break
    return out


def _busy_sessions() -> list[list[str]]:
    """The store's sessions that are not idle (a transaction left open by a cut host holds its row locks, and a
    sender waiting on one renews nothing): pid, state, age of the transaction, what it waits on, its client."""
    from sqlalchemy import text

    from tests.support.process_store import transaction

    with transaction() as conn:
        rows = conn.execute(
            text(
                "SELECT pid, state, now() - xact_start, wait_event_type, wait_event, client_addr, left(query, 160)"
                " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND state <> 'idle'"
            )
        ).all()
    return [[str(v) for v in r] for r in rows]


def _log_lines(workdir: Path, message_id: int, limit: int = 12) -> list[str]:
    """The last lines of the hosts' logs that name the message or its confirmation."""
    marks = (f"message {message_id} ", f"message {message_id}:", f"confirmation {message_id} ", f"[{message_id}]")
    found = []
    for log in sorted(workdir.rglob("*.log")):
        with open(log, errors="replace") as lines:
            found += [
                f"{log.relative_to(workdir)}: {line.strip()[:300]}" for line in lines if any(m in line for m in marks)
            ]
    return found[-limit:]


def chaos_run(
    workdir: Path,
    seed: int,
    seconds: float,
    rate: float = 2.0,
    order: list[str] | None = None,
    kinds: list[str] | None = None,
    hosts: int = 3,
    settle: float = 240.0,
    extra: dict[str, str] | None = None,
    longest: float = 30.0,
    calm: tuple[float, float] = (3.0, 10.0),
) -> tuple[Any, dict[str, Any]]:
    """Submit traffic for `seconds` while faults are injected from `seed`, wait up to `settle` s for
    every message to be final and confirmed, and check the external system's log; returns the
    checker's report and what happened (faults, submissions, timings)."""
    from openhub.core.states import FINAL
    from tests.support.history import check

    final = {s.value for s in FINAL}
    with rig(workdir, hosts, extra=extra) as the_rig:
        for path in FUNNEL_PATHS:
            the_rig.external.delay(path, FUNNEL_HOLD)
        origin = time.monotonic()
        traffic = Traffic(the_rig, rate, seed)
        driver = FaultDriver(the_rig, seed, kinds=kinds, longest=longest, calm=calm)
        stop = threading.Event()
        sender = threading.Thread(target=traffic.run, args=(stop,), name="traffic", daemon=True)
        sender.start()
        try:
            driver.run(seconds, order=order)
        finally:
            driver.heal_all()
            stop.set()
            sender.join(timeout=30)
        faults_done = time.monotonic()
        ids = [v["id"] for v in traffic.submitted.values()]
        external = the_rig.external

        def settled() -> bool:
            states = _states(ids)
            confirmed = {c.key for c in list(external.calls) if c.path.endswith("/confirm") and c.status < 400}
            return all(states.get(i) in final and f"{i}:{states[i]}" in confirmed for i in ids)

        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            try:
                if settled():
                    break
            except Exception:
                pass
            time.sleep(1.0)  # polling interval of the bounded wait
        settled_after = time.monotonic() - faults_done
        confirmed = {c.key for c in list(external.calls) if c.path.endswith("/confirm") and c.status < 400}
        unsettled = _unsettled(ids, {k for k in confirmed if k}, final, list(external.calls), workdir)
        report = check(
            list(external.calls),
            list(external.overlaps),
            driver.log,
            the_rig.host_of,
            traffic.submitted,
            _states(ids),
            final,
            origin,
        )
        facts = {
            "seed": seed,
            "seconds": round(faults_done - origin, 1),
            "settled_after": round(settled_after, 1),
            "submitted": len(ids),
            "routes": dict(Counter(v["route"] for v in traffic.submitted.values())),
            "refused_batches": traffic.refused,
            "netem": the_rig.netem,
            "faults": [f.as_dict(origin) for f in driver.log],
            "unsettled": unsettled,
            "store_sessions": _busy_sessions() if unsettled else [],
        }
        (workdir / "report.json").write_text(
            json.dumps({"summary": report.summary(), "facts": facts, "details": report.details(200)}, indent=1)
        )
        return report, facts
