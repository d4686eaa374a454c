"""openhub side by side with a plain Celery chain and DBOS Transact (issue 10).

    PYTHONPATH=. .venv/bin/python bench/peers.py [--messages 1000] [--runs 3]
        [--variants plain,hub,hub1,fused,batch,dbos] [--latency-ms 0] [--pool prefork|gevent|threads]
        [--concurrency 2] [--processes 1] [--warmup 200] [--http-client sharded,pooled,httpcall] [--burn 0]
        [--broker redis|amqp]

The same 3-step route body (one POST per step to a local keep-alive HTTP server that answers
after --latency-ms, 0 by default: bench/slow_server.py; the pooled httpx clients of bench/flows.py, or
with --http-client pooled the product's `openhub.outbound.http.pooled_client()`, or with httpcall the
route's steps written on the product's `HttpCall`; several, comma-separated, run side by side, each
variant once per client in every run, labelled VARIANT/CLIENT)
run as
  (a) plain  - a plain Celery chain of 3 tasks (bench/plain_tasks.py), apply_async per chain
  (b) hub    - openhub, today's chain mode, submit_many in batches of 100
      hub1   - openhub, chain mode, one openhub.submit() per message
  (c) fused  - openhub fused mode (Route(..., fused=True)): one Celery task per message, submit_many
      batch  - openhub batch mode (Route(..., batch=100)): one Celery task per 100 messages submitted
               together, each step entered and recorded for all of them in one transaction
  (d) dbos   - a DBOS Transact workflow of 3 steps on a DBOS queue (bench/dbos_app.py),
               2 worker processes with worker_concurrency=1, enqueued with DBOSClient
each in its own fresh PostgreSQL database and private redis-server, interleaved run by run. With
--broker amqp the Celery variants' broker is a private RabbitMQ node instead, started fresh for each
variant and run (tests/support/backends.RabbitServer: no plugins, consumer_timeout 3600 s); the
redis-server stays for the benchmark's own counters, and the broker's CPU figure is the node's.
Celery variants: `--processes P` (default 1) `celery -A tasks worker --pool POOL --concurrency N`
(prefork -c 2 by default, no beat; several gevent processes use several cores). DBOS: 2 processes of
worker_concurrency max(1, N x P // 2) each, so as many workflows in flight as the Celery workers have
steps in flight.

Per variant and run: messages/s end to end (first submit to last message done, after a
200-message warm-up); worker CPU ms/message (/proc utime+stime of the worker processes and
all their descendants, before/after); PostgreSQL CPU ms/message (/proc utime+stime of the
backends connected to the variant's database, before/after; backends that exit in between are
not counted - pools keep theirs open); commits, inserted+updated+deleted tuples per message
(pg_stat_database deltas, minus the benchmark's own polling transactions); store bytes per
finished message (pg_total_relation_size of the store's tables / messages stored); machine CPU
ms/message and busy share, every process of the box (/proc/stat: worker, PostgreSQL, Redis, the
HTTP server, this process submitting and polling, and whatever else runs): a busy share near 1.0
means the variant ran as fast as the cores allowed; its rate is cores x busy share / machine CPU.
Also per variant and run: whether each step of every message (warm-up included) was called
exactly once (the HTTP server's count per path: calls == distinct paths == 3 x messages), the peak
of calls in flight at the server during the measured part, and the peak RSS of all the worker's
processes together (sum of VmRSS, sampled every 0.5 s: shared pages are counted in every process).
With --profile DIR, the measured part of each variant is also profiled: `py-spy record` (beside the
python, or $PY_SPY) on the worker's processes (DIR/VARIANT-RUN.txt, collapsed stacks, and the top
functions by bench/collapsed.py printed), CPU ms/message of the broker, the HTTP server and this
process from /proc, and, if the PostgreSQL server preloads pg_stat_statements (a private cluster:
OPENHUB_TEST_PG), the SQL statements per message.
Then submit figures with no worker running: openhub.submit() one per message from one
thread, submit_many in batches of 100, DBOSClient.enqueue one per message.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402

from bench.slow_server import serve_slow  # noqa: E402
from tests.support.backends import RabbitServer, RedisServer, activate, free_port, postgres_database  # noqa: E402
from tests.support.burner import spin  # noqa: E402
from tests.support.workers import Worker  # noqa: E402

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20
WARMUP = 200  # --warmup
HTTP = {"port": 0, "pid": 0}  # the slow server's, set by main()
ENV: dict[str, int] = {}  # the current variant's broker's pid (redis-server or the RabbitMQ node)
BROKER = {"kind": "redis"}  # --broker
PROFILE: dict = {"dir": None, "rate": 100, "tag": ""}  # --profile; tag: the variant and run being measured


# ---------------------------------------------------------------- measuring
def _stat(pid: int) -> tuple[int, int]:
    """(ppid, utime+stime ticks) of a process, (0, 0) if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[11]) + int(fields[12])
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0, 0


def tree(roots: list[int]) -> set[int]:
    """The processes `roots` and all their live descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parents.setdefault(_stat(int(entry))[0], []).append(int(entry))
    todo, seen = list(roots), set()
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += parents.get(pid, [])
    return seen


def tree_cpu_ms(roots: list[int]) -> float:
    """CPU ms of the processes `roots` and all their live descendants."""
    return sum(_stat(pid)[1] for pid in tree(roots)) * TICK_MS


def tree_rss_mb(roots: list[int]) -> float:
    """Sum of the resident set sizes of `roots` and their descendants, MB."""
    total = 0
    for pid in tree(roots):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total * PAGE_MB


class RssPeak:
    """Samples tree_rss_mb(roots) every 0.5 s in a thread; `peak` is the highest sum seen."""

    def __init__(self, roots: list[int]) -> None:
        self.roots, self.peak = roots, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.roots))
            self._stop.wait(0.5)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, tree_rss_mb(self.roots))


def server_stats(reset: bool = False) -> dict[str, int]:
    """The slow server's counters (see bench/slow_server.py); each call starts a new peak."""
    import httpx

    url = f"http://127.0.0.1:{HTTP['port']}/"
    if reset:
        httpx.post(url + "_reset").raise_for_status()
    return httpx.get(url + "_stats").json()


def exactly_once(stats: dict[str, int], messages: int) -> float:
    """1.0 if each of the 3 steps of `messages` messages was called exactly once, else 0.0."""
    return float(stats["calls"] == stats["keys"] == 3 * messages and stats["max_per_key"] == 1)


class PgMeter:
    """CPU of a database's backends and its pg_stat_database counters, before/after."""

    def __init__(self, url: str, schemas: tuple[str, ...]) -> None:
        self.db = url.rsplit("/", 1)[1]
        self.schemas = schemas
        self.engine = sqlalchemy.create_engine(
            url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
        )

    def snapshot(self) -> dict[str, object]:
        time.sleep(0.6)  # PostgreSQL 15 flushes backend statistics at most every 500 ms
        with self.engine.connect() as conn:
            pids = [
                r[0] for r in conn.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.db,))
            ]
            row = conn.exec_driver_sql(
                "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database WHERE datname = %s",
                (self.db,),
            ).one()
        return {"cpu": {pid: _stat(pid)[1] for pid in pids}, "commits": row[0], "writes": row[1] + row[2] + row[3]}

    @staticmethod
    def delta(before: dict, after: dict) -> dict[str, float]:
        cpu = sum(t - before["cpu"].get(pid, 0) for pid, t in after["cpu"].items()) * TICK_MS
        return {
            "pg_ms": cpu,
            "commits": after["commits"] - before["commits"],
            "writes": after["writes"] - before["writes"],
        }

    def store_bytes(self, url: str) -> int:
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as conn:
            size = conn.exec_driver_sql(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname = ANY(%s) "
                "AND c.relname <> 'alembic_version'",
                (list(self.schemas),),
            ).scalar()
        engine.dispose()
        return int(size)


class Poller:
    """Waits for a count query to reach n on its own connection, counting its own transactions."""

    def __init__(self, url: str, query: str) -> None:
        self.engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self.query = query
        self.polls = 0

    def wait(self, n: int, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.polls += 1
            if self.conn.exec_driver_sql(self.query).scalar() >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.query} < {n}")
            time.sleep(0.1)

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


# ---------------------------------------------------------------- the variants
HTTP_CLIENT = {"kind": "sharded"}  # --http-client of the variant in hand (bench/flows.py BENCH_HTTP_CLIENT)


class Env:
    """A fresh database, a private redis-server (and with --broker amqp a private RabbitMQ node) and the
    OPENHUB_* environment pointing at them."""

    def __init__(
        self, workdir: Path, http_port: int, url: str, pool: str = "prefork", concurrency: int = 2, processes: int = 1
    ) -> None:
        self.redis = RedisServer.start(workdir / "redis")
        self.rabbit = RabbitServer.start() if BROKER["kind"] == "amqp" else None
        self.url, self.workdir = url, workdir
        self.pool, self.concurrency, self.processes = pool, concurrency, processes
        broker = self.rabbit or self.redis
        assert broker.process is not None
        ENV["broker"] = broker.process.pid
        self.env = {
            "OPENHUB_DATABASE_URL": url,
            "OPENHUB_BROKER_URL": broker.url,
            "OPENHUB_ROUTES": "bench.flows",
            "OPENHUB_VAR_DIR": str(workdir / "var"),
            "BENCH_HTTP_URL": f"http://127.0.0.1:{http_port}/",
            "BENCH_HTTP_CLIENT": HTTP_CLIENT["kind"],  # bench/flows.py
            "BENCH_HTTP_CLIENTS": str(max(1, concurrency // 16)),
            "BENCH_COUNTER_URL": f"redis://127.0.0.1:{self.redis.port}/1",
        }
        if self.rabbit is not None:
            self.env["OPENHUB_CONSUMER_TIMEOUT"] = "3600"  # the node's (RabbitServer.start's default)
        activate({k: v for k, v in self.env.items() if k.startswith("OPENHUB_")})  # BENCH_*: the workers'
        from openhub.store.migrate import upgrade

        upgrade(url)

    def worker(self) -> "Workers":
        """`--processes` Celery worker processes, each `--pool POOL --concurrency N` (several gevent
        processes: one per core, as deploy/ runs them)."""
        started = []
        try:
            for _ in range(self.processes):
                worker = Worker(self.env, self.workdir, beat=False, concurrency=self.concurrency, pool=self.pool)
                worker.args += ["--include", "bench.plain_tasks"]
                started.append(worker.start())
        except BaseException:
            Workers(started).stop()
            raise
        return Workers(started)


class Workers:
    """The worker processes of one variant: their pids (for /proc and py-spy) and one stop."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.pids = [w.process.pid for w in workers]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def machine_ms() -> tuple[float, float]:
    """(busy, all) CPU milliseconds of the whole machine so far, every core (/proc/stat)."""
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) * TICK_MS, sum(ticks) * TICK_MS


class Profile:
    """py-spy on the worker, /proc CPU of the other processes and pg_stat_statements, over the measured part."""

    def __init__(self, pg: PgMeter, roots: list[int], others: dict[str, int]) -> None:
        self.pg, self.roots, self.others = pg, roots, others
        self.out = Path(PROFILE["dir"]) / f"{PROFILE['tag']}.txt"
        with pg.engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_statements_reset()") if self._statements(conn) else None
        self.cpu = {k: _stat(pid)[1] * TICK_MS for k, pid in others.items()}  # each process alone
        spy = os.environ.get("PY_SPY") or str(Path(sys.executable).parent / "py-spy")  # or another install
        self.spy = [
            subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--subprocesses",
                    "--nonblocking",
                    "--rate",
                    str(PROFILE["rate"]),
                    "--format",
                    "raw",
                    "--output",
                    str(self.out.with_suffix(f".{pid}.txt")),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid in roots
        ]
        self.worker_cpu = tree_cpu_ms(roots)

    def _statements(self, conn) -> bool:
        try:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.exec_driver_sql("SELECT 1 FROM pg_stat_statements LIMIT 1")
            return True
        except sqlalchemy.exc.DBAPIError:
            return False

    def stop(self, n: int) -> dict[str, float]:
        """Stop profiling after n messages: print and write the summary, return CPU ms/message per process."""
        from bench.collapsed import report

        cpu = {f"{k}_ms": (_stat(pid)[1] * TICK_MS - self.cpu[k]) / n for k, pid in self.others.items()}
        cpu["pyspy_ms"] = sum(tree_cpu_ms([spy.pid]) for spy in self.spy) / n
        worker_ms = (tree_cpu_ms(self.roots) - self.worker_cpu) / n
        for spy in self.spy:
            spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
        for spy in self.spy:
            spy.wait(timeout=60)
        with self.out.open("w") as f:
            for part in sorted(self.out.parent.glob(f"{self.out.stem}.*.txt")):
                f.write(part.read_text())
                part.unlink()
        lines = [
            f"worker CPU {worker_ms:.2f} ms/message (/proc), shared out by the samples:",
            report(self.out, 35, worker_ms),
        ]
        engine = sqlalchemy.create_engine(
            self.pg.engine.url.set(database=self.pg.db), poolclass=sqlalchemy.pool.NullPool
        )
        with engine.connect() as conn:
            if self._statements(conn):
                rows = conn.exec_driver_sql(
                    "SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g') "
                    "FROM pg_stat_statements "
                    "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND query NOT LIKE '%%pg_stat_statements%%' ORDER BY calls DESC"
                ).all()
                conn.commit()
                lines.append(
                    f"SQL statements (nested ones too: foreign key checks): {sum(r[0] for r in rows) / n:.1f} "
                    f"per message, {sum(r[1] for r in rows) / n:.2f} ms execution per message; "
                    "per message: calls, ms, rows, statement"
                )
                lines += [f"  {r[0] / n:6.2f} {r[1] / n:6.3f} {r[2] / n:6.2f}  {r[3][:300]}" for r in rows[:40]]
        engine.dispose()
        text = "\n".join(lines)
        self.out.with_suffix(".summary").write_text(text + "\n")
        print(text, flush=True)
        return cpu


def _measure(pg: PgMeter, roots: list[int], submit, wait, n: int) -> dict[str, float]:
    """Submit and wait for n messages after the warm-up's WARMUP (the server counted those already)."""
    others = {"http": HTTP["pid"], "bench": os.getpid()}
    if ENV.get("broker"):
        others["broker"] = ENV["broker"]
    profile = Profile(pg, roots, others) if PROFILE["dir"] else None
    before_pg, before_cpu = pg.snapshot(), tree_cpu_ms(roots)
    rss = RssPeak(roots)
    server_stats()  # a new peak of calls in flight from here
    before_box, started = machine_ms(), time.perf_counter()
    sent = offer(submit, n, OPEN_LOOP["rate"]) if OPEN_LOOP["rate"] else (submit(n), {})[1]
    wait(n)
    elapsed, after_box = time.perf_counter() - started, machine_ms()
    latency = latencies(sent) if sent else {}
    after_cpu, calls = tree_cpu_ms(roots), server_stats()
    rss_mb, after_pg = rss.stop(), pg.snapshot()
    d = PgMeter.delta(before_pg, after_pg)
    busy, every = after_box[0] - before_box[0], after_box[1] - before_box[1]
    extra = profile.stop(n) if profile else {}
    return {
        **extra,
        **latency,
        "rate": n / elapsed,
        "worker_ms": (after_cpu - before_cpu) / n,
        "pg_ms": d["pg_ms"] / n,
        "box_ms": busy / n,
        "box_busy": busy / every,
        "commits": d["commits"],
        "writes": d["writes"] / n,
        "once": exactly_once(calls, n + WARMUP),
        "in_flight": calls["peak"],
        "rss_mb": rss_mb,
    }


OPEN_LOOP = {"rate": 0.0}  # --rate: messages offered per second, Poisson arrivals; 0: all at once


def offer(submit, n: int, rate: float) -> dict[str, float]:
    """Submit n messages one at a time at exponentially distributed gaps (mean 1/rate: an open loop that
    does not wait for the hub); {message key: time.time() of its submit}. A submit running late is
    followed by the next at once, so the offered rate holds as long as submitting keeps up."""
    gaps = random.Random(42)
    sent: dict[str, float] = {}
    at = time.perf_counter()
    for _ in range(n):
        at += gaps.expovariate(rate)
        pause = at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        begun = time.time()
        for key in submit(1):
            sent[key] = begun
    return sent


def latencies(sent: dict[str, float]) -> dict[str, float]:
    """Submit -> answer of the last step's call, ms: p50, p90, p99, max over the messages of `sent`."""
    import httpx

    done = httpx.get(f"http://127.0.0.1:{HTTP['port']}/_done").json()
    ms = sorted((done[k] - t) * 1000 for k, t in sent.items() if k in done)
    if len(ms) < len(sent):
        raise RuntimeError(f"{len(sent) - len(ms)} messages have no answered last call")

    def at(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return {"p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99), "max_ms": ms[-1]}


def _warm(submit, wait) -> None:
    """Forget the server's counts, then run the warm-up's WARMUP messages."""
    server_stats(reset=True)
    submit(WARMUP)
    wait(WARMUP)


def run_plain(env: Env, n: int) -> dict[str, float]:
    import redis
    from celery import chain

    from openhub.celery.dispatch import celery_app

    app = celery_app()
    counter = redis.Redis(host="127.0.0.1", port=env.redis.port, db=1)
    seq = iter(range(10**9))  # each message its own paths at the server

    def submit(k: int) -> list[str]:
        keys = []
        for _ in range(k):
            i = next(seq)
            chain(
                app.signature("bench.plain.first", args=(i,), immutable=True),
                app.signature("bench.plain.second", args=(i,), immutable=True),
                app.signature("bench.plain.third", args=(i,), immutable=True),
            ).apply_async()
            keys.append(str(i))
        return keys

    def wait(k: int) -> None:
        deadline = time.monotonic() + 900
        while int(counter.get("bench:plain:done") or 0) < k:
            if time.monotonic() > deadline:
                raise TimeoutError(f"plain chains done < {k}")
            time.sleep(0.02)

    worker = env.worker()
    try:
        _warm(submit, wait)
        counter.delete("bench:plain:done")
        pg = PgMeter(env.url, ("public",))
        result = _measure(pg, worker.pids, submit, wait, n)
    finally:
        worker.stop()
    result["commits"] /= n
    result["store_b"] = 0.0
    return result


def _hub(env: Env, n: int, batch: int, route: str = "bench.flow") -> dict[str, float]:
    import openhub

    seq = iter(range(10**9))

    def submit(k: int) -> list[str]:
        keys = []
        if batch == 1:
            for _ in range(k):
                i = next(seq)
                view = openhub.submit(route, {"i": i}, source_system="BENCH", correlation_id=f"p-{i}")
                keys.append(str(view.id))
        else:
            for start in range(0, k, batch):
                items = []
                for _ in range(min(batch, k - start)):
                    i = next(seq)
                    items.append(
                        {"route": route, "payload": {"i": i}, "source_system": "BENCH", "correlation_id": f"p-{i}"}
                    )
                keys += [str(view.id) for view in openhub.submit_many(items)]
        return keys

    poller = Poller(env.url, "SELECT count(*) FROM messages WHERE state = 'OK'")
    done = {"n": 0}

    def wait(k: int) -> None:
        poller.wait(done["n"] + k)
        done["n"] += k

    worker = env.worker()
    try:
        _warm(submit, wait)
        pg = PgMeter(env.url, ("public",))
        polls = poller.polls
        result = _measure(pg, worker.pids, submit, wait, n)
        result["commits"] = (result["commits"] - (poller.polls - polls)) / n
        result["store_b"] = pg.store_bytes(env.url) / (n + WARMUP)
    finally:
        worker.stop()
        poller.close()
    return result


def run_hub(env: Env, n: int) -> dict[str, float]:
    return _hub(env, n, 100)


def run_hub1(env: Env, n: int) -> dict[str, float]:
    return _hub(env, n, 1)


def run_fused(env: Env, n: int) -> dict[str, float]:
    return _hub(env, n, 100, "bench.fused")


def run_batch(env: Env, n: int) -> dict[str, float]:
    if env.pool == "gevent" and HTTP_CLIENT["kind"] == "sharded":
        # Each task keeps a batch of calls in flight, not one: clients for them all (httpcore scans
        # every connection of its pool per request: hundreds on one client cost ms per call)
        from bench.flows import BATCH

        env.env["BENCH_HTTP_CLIENTS"] = str(max(1, min(env.concurrency * BATCH, n // env.processes) // 16))
    return _hub(env, n, 100, "bench.batch")


def _dbos_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _dbos_workers(env: Env) -> list[subprocess.Popen]:
    procs = []
    for k in range(2):
        log = open(env.workdir / f"dbos-{k}.log", "ab")
        p = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "dbos_app.py"),
                _dbos_url(env.url),
                str(max(1, env.concurrency * env.processes // 2)),
            ],
            env=dict(os.environ, **env.env, DBOS__VMID=f"peers-{k}", PYTHONPATH=str(ROOT)),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        procs.append(p)
    for p in procs:
        line = p.stdout.readline()
        if "ready" not in line:
            raise RuntimeError(f"DBOS worker did not start: {(env.workdir / 'dbos-0.log').read_text()[-2000:]}")
    return procs


def _dbos_client(env: Env):
    from dbos import DBOSClient

    return DBOSClient(system_database_url=_dbos_url(env.url), application_name="openhub-peers")


def run_dbos(env: Env, n: int) -> dict[str, float]:
    procs = _dbos_workers(env)  # they create the system database's schema
    client = _dbos_client(env)
    seq = iter(range(10**9))
    options = {"workflow_name": "peers_flow", "queue_name": "peers", "app_version": "bench"}

    def submit(k: int) -> list[str]:
        keys = [str(next(seq)) for _ in range(k)]
        for i in keys:
            client.enqueue(options, int(i))
        return keys

    poller = Poller(env.url, "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'")
    done = {"n": 0}

    def wait(k: int) -> None:
        poller.wait(done["n"] + k)
        done["n"] += k

    try:
        _warm(submit, wait)
        pg = PgMeter(env.url, ("dbos",))
        polls = poller.polls
        result = _measure(pg, [p.pid for p in procs], submit, wait, n)
        result["commits"] = (result["commits"] - (poller.polls - polls)) / n
        result["store_b"] = pg.store_bytes(env.url) / (n + WARMUP)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        client.destroy()
        poller.close()
    return result


RUNNERS = {
    "plain": run_plain,
    "hub": run_hub,
    "hub1": run_hub1,
    "fused": run_fused,
    "batch": run_batch,
    "dbos": run_dbos,
}


# ---------------------------------------------------------------- submit side alone
def submit_figures(env: Env, n: int) -> dict[str, tuple[float, float]]:
    """(messages/s, CPU ms per message of this process) with no worker running."""
    import openhub

    out = {}
    for name, batch in (("submit", 1), ("submit_many/100", 100)):
        items = [
            {"route": "bench.flow", "payload": {"i": i}, "source_system": "BENCH", "correlation_id": f"{name}-{i}"}
            for i in range(n)
        ]
        cpu, wall = time.process_time(), time.perf_counter()
        if batch == 1:
            for item in items:
                openhub.submit(
                    item["route"], item["payload"], source_system="BENCH", correlation_id=item["correlation_id"]
                )
        else:
            for s in range(0, n, batch):
                openhub.submit_many(items[s : s + batch])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[name] = (n / wall, cpu * 1000 / n)
    out.update(_callers_figures(env, n))
    from openhub.store.db import dispose_engines

    dispose_engines()
    return out


def _callers_figures(env: Env, n: int) -> dict[str, tuple[float, float]]:
    """A caller that writes a row of its own with each message (issue 37): in two transactions (its row,
    then `submit()`), and in one (`submit(..., connection=)` in its transaction: published after its commit)."""
    import openhub

    engine = sqlalchemy.create_engine(env.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS bench_orders (id serial PRIMARY KEY, i int NOT NULL)")
    order = sqlalchemy.text("INSERT INTO bench_orders (i) VALUES (:i)")
    out = {}
    for name, joined in (("caller's row, then submit", False), ("submit in the caller's transaction", True)):
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(n):
            with engine.begin() as conn:
                conn.execute(order, {"i": i})
                if joined:
                    openhub.submit(
                        "bench.flow", {"i": i}, source_system="BENCH", correlation_id=f"tx-{i}", connection=conn
                    )
            if not joined:
                openhub.submit("bench.flow", {"i": i}, source_system="BENCH", correlation_id=f"two-{i}")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[name] = (n / wall, cpu * 1000 / n)
    engine.dispose()
    return out


def dbos_enqueue_figure(env: Env, n: int) -> tuple[float, float]:
    procs = _dbos_workers(env)  # create the schema, then stop consuming
    for p in procs:
        p.terminate()
        p.wait(timeout=30)
    client = _dbos_client(env)
    options = {"workflow_name": "peers_flow", "queue_name": "peers", "app_version": "bench"}
    client.enqueue(options, -1)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        client.enqueue(options, i)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    client.destroy()
    return n / wall, cpu * 1000 / n


# ---------------------------------------------------------------- main
def fresh(workdir: Path, http_port: int, tag: str, fn, pool: str = "prefork", concurrency: int = 2, processes: int = 1):
    sub = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=workdir))
    with postgres_database(f"openhub_peers_{tag}") as url:
        env = Env(sub, http_port, url, pool, concurrency, processes)
        try:
            return fn(env)
        finally:
            env.redis.stop()
            if env.rabbit is not None:
                env.rabbit.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default="plain,hub,hub1,fused,batch,dbos")
    parser.add_argument("--submits", type=int, default=1000, help="messages for the submit-only figures (0: skip)")
    parser.add_argument("--latency-ms", type=float, default=0, help="how long each external call takes")
    parser.add_argument(
        "--pool", default="prefork", choices=("prefork", "gevent", "threads"), help="the Celery worker's pool (-P)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=2, help="each Celery worker's -c; DBOS: 2 processes x (c x processes)/2"
    )
    parser.add_argument("--processes", type=int, default=1, help="Celery worker processes (gevent: one per core)")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="messages run before each measured part")
    parser.add_argument("--profile", metavar="DIR", help="profile each measured part into DIR (see above)")
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument(
        "--http-client",
        default="sharded",
        help="steps call through one client per 16 in flight (sharded), the product's pooled_client() (pooled), "
        "or the product's HttpCall (httpcall); several, comma-separated: each variant once per client, side by side",
    )
    parser.add_argument(
        "--burn",
        type=int,
        default=0,
        metavar="N",
        help="N processes spinning on the CPU beside the whole run (tests/support/burner.py): a busy box; "
        "machine CPU figures then count the spinners too",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="offer the measured messages one at a time at this rate (msg/s, Poisson arrivals) and report "
        "submit -> last call answered p50/p90/p99/max; 0: submit them all at once (throughput)",
    )
    parser.add_argument(
        "--broker",
        default="redis",
        choices=("redis", "amqp"),
        help="the Celery variants' broker: a private redis-server, or a private RabbitMQ node (amqp)",
    )
    args = parser.parse_args()
    BROKER["kind"] = args.broker
    OPEN_LOOP["rate"] = args.rate
    clients = args.http_client.split(",")
    for client in clients:
        if client not in ("sharded", "pooled", "httpcall"):
            parser.error(f"--http-client: sharded, pooled or httpcall, not {client!r}")
    PROFILE.update(dir=args.profile, rate=args.profile_rate)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    globals()["WARMUP"] = args.warmup

    workdir = Path(tempfile.mkdtemp(prefix="openhub-peers-"))
    http_port = HTTP["port"] = free_port()
    server = multiprocessing.Process(target=serve_slow, args=(http_port, args.latency_ms), daemon=True)
    server.start()
    HTTP["pid"] = server.pid
    load = os.getloadavg()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.burn)]
    for spinner in spinners:
        spinner.start()
    label = {(v, c): v if len(clients) == 1 else f"{v}/{c}" for v in variants for c in clients}
    results: dict[str, list[dict[str, float]]] = {label[v, c]: [] for v in variants for c in clients}
    try:
        for run in range(args.runs):
            for v, client in label:  # interleaved: plain, hub, hub1, dbos, plain, ... (each once per client)
                PROFILE["tag"] = f"{label[v, client].replace('/', '-')}-{run + 1}"
                HTTP_CLIENT["kind"] = client
                r = fresh(
                    workdir,
                    http_port,
                    v,
                    lambda env, v=v: RUNNERS[v](env, args.messages),
                    args.pool,
                    args.concurrency,
                    args.processes,
                )
                results[label[v, client]].append(r)
                print(
                    f"run {run + 1} {label[v, client]:6s} " + " ".join(f"{k}={x:.2f}" for k, x in r.items()),
                    flush=True,
                )
        subs = []
        if args.submits:
            for _ in range(args.runs):
                subs.append(fresh(workdir, http_port, "submit", lambda env: submit_figures(env, args.submits)))
                if "dbos" in variants:
                    subs[-1]["dbos enqueue"] = fresh(
                        workdir, http_port, "enq", lambda env: dbos_enqueue_figure(env, args.submits)
                    )
    finally:
        server.terminate()
        for spinner in spinners:
            spinner.terminate()

    def med(xs: list[float], digits: int = 1) -> str:
        return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"

    print(
        f"\n{args.messages} messages per run (+{WARMUP} warm-up), {args.runs} runs interleaved, "
        f"external call {args.latency_ms:g} ms, --pool {args.pool} --concurrency {args.concurrency} "
        f"--processes {args.processes}, --burn {args.burn}, --http-client {args.http_client}, "
        f"{os.cpu_count()} cores, load average before: {load}, after: {os.getloadavg()}; median (min-max)"
    )
    print(
        "| variant | msg/s | vs plain | worker CPU ms/msg | PG CPU ms/msg | machine CPU ms/msg | machine busy "
        "| commits/msg | tuples written/msg | store B/msg | calls in flight, peak | worker RSS MB, peak "
        "| runs with each step exactly once |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (_v, client), name in label.items():
        rs, plain = results[name], results.get(label.get(("plain", client), ""))
        ratio = med([r["rate"] / p["rate"] for r, p in zip(rs, plain)], 2) if plain else "-"
        print(
            f"| {name} | {med([r['rate'] for r in rs])} | {ratio} | {med([r['worker_ms'] for r in rs])} | "
            f"{med([r['pg_ms'] for r in rs])} | {med([r['box_ms'] for r in rs])} | "
            f"{med([r['box_busy'] for r in rs], 2)} | {med([r['commits'] for r in rs])} | "
            f"{med([r['writes'] for r in rs])} | {med([r['store_b'] for r in rs])} | "
            f"{med([r['in_flight'] for r in rs], 0)} | {med([r['rss_mb'] for r in rs], 0)} | "
            f"{sum(int(r['once']) for r in rs)}/{len(rs)} |"
        )
    if len(clients) > 1:
        print(
            f"\nAgainst --http-client {clients[0]}, run by run: msg/s ratio, worker CPU ms/msg difference; "
            "median (min-max)"
        )
        print("| variant | msg/s ratio | worker CPU ms/msg, difference |\n|---|---|---|")
        for (v, client), name in label.items():
            if client != clients[0]:
                base = results[label[v, clients[0]]]
                rates = [r["rate"] / b["rate"] for r, b in zip(results[name], base)]
                cpu = [r["worker_ms"] - b["worker_ms"] for r, b in zip(results[name], base)]
                print(f"| {name} | {med(rates, 2)} | {med(cpu, 2)} |")
    if args.rate:
        print(
            f"\nSubmit -> the last step's call answered, ms, {args.rate:g} msg/s offered (Poisson), median of runs "
            "(min-max)\n| variant | p50 | p90 | p99 | max |\n|---|---|---|---|---|"
        )
        for v, rs in results.items():
            print(
                f"| {v} | "
                + " | ".join(med([r[q] for r in rs], 0) for q in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
                + " |"
            )
    if subs:
        print("\n| submit side, no worker | msg/s | CPU ms/msg (submitting process) |\n|---|---|---|")
        for k in subs[0]:
            print(f"| {k} | {med([s[k][0] for s in subs])} | {med([s[k][1] for s in subs])} |")


if __name__ == "__main__":
    main()
