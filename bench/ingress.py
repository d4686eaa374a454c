"""Ingress benchmark: accepted messages per second and POST latency with 1 and 4 uvicorn workers.

    .venv/bin/python bench/ingress.py [--workers 1 4] [--seconds 15] [--concurrency 4 16] [--record]

Each run gets a fresh PostgreSQL database on 127.0.0.1:5432 (dropped afterwards) and a private
redis-server on a free loopback port as the broker (so nothing on the machine's own Redis is
touched), then starts `openhub serve --workers N` and drives
`POST /api/v1/messages/customer/setCustomer` from a closed-loop load generator on loopback:
`--concurrency` keep-alive connections, each sending its next request when the previous answer
arrived (bounded: never more than `--concurrency` requests in flight). Only 202 answers count as
accepted; every answer means the message was committed to PostgreSQL and its chain published to
Redis. No worker runs: this measures the ingress alone. `--record` writes the figures into
bench/RESULTS.md under "## Ingress (issue 4)". Nothing here is a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.served import served  # noqa: E402
from bench.wire import read_message  # noqa: E402
from tests.support.backends import RedisServer, postgres_database  # noqa: E402

KEY = "bench-" + uuid.uuid4().hex
SECTION = "## Ingress (issue 4)"


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, int]]:
    """A private redis-server: its URL and process id (for CPU accounting)."""
    server = RedisServer.start(workdir / "redis")
    try:
        yield server.url, server.process.pid
    finally:
        server.stop()


async def _connection(
    port: int,
    stop_at: float,
    measure_from: float,
    run: str,
    ident: int,
    latencies: list[float],
    statuses: dict[int, int],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    try:
        while time.perf_counter() < stop_at:
            i += 1
            body = json.dumps({"externalCustomerId": str(i % 1000), "name": "bench"}).encode()
            request = (
                f"POST /api/v1/messages/customer/setCustomer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {KEY}\r\nX-Correlation-Id: {run}-{ident}-{i}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            started = time.perf_counter()
            writer.write(request)
            head = await read_message(reader)
            status = int(head.split(b" ", 2)[1])
            ended = time.perf_counter()
            if started >= measure_from:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 202:
                    latencies.append(ended - started)
    finally:
        writer.close()


async def load(port: int, seconds: float, warmup: float, concurrency: int) -> tuple[list[float], dict[int, int], float]:
    run = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    now = time.perf_counter()
    measure_from, stop_at = now + warmup, now + warmup + seconds
    await asyncio.gather(
        *(_connection(port, stop_at, measure_from, run, c, latencies, statuses) for c in range(concurrency))
    )
    return latencies, statuses, seconds


def process_tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and its descendants."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry.name), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        stats[pid] = (int(fields[11]) + int(fields[12])) / tick
    todo = [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def pids_cpu(pids: list[int]) -> float:
    """CPU seconds used so far by these processes (0 for those gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def own_cpu() -> float:
    """CPU seconds of this process (the load generator)."""
    t = os.times()
    return t.user + t.system


def postgres_backends(database: str) -> list[int]:
    """Process ids of the PostgreSQL backends connected to the benchmark's database."""
    import sqlalchemy

    name = database.rsplit("/", 1)[1]
    admin = sqlalchemy.create_engine(f"{database.rsplit('/', 1)[0]}/postgres")
    with admin.connect() as conn:
        pids = [r[0] for r in conn.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))]
    admin.dispose()
    return pids


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench(workers: int, seconds: float, warmup: float, concurrency: int, workdir: Path) -> dict:
    with redis_server(workdir) as (broker, redis_pid), postgres_database("openhub_bench") as database:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENHUB_", "PROMETHEUS_"))}
        env.update(
            OPENHUB_DATABASE_URL=database,
            OPENHUB_BROKER_URL=broker,
            OPENHUB_ROUTES="routes",
            OPENHUB_API_KEYS=f"CRM={KEY}",  # routes/customers.py takes CRM's messages only
            OPENHUB_ADMIN_TOKEN="admin-" + uuid.uuid4().hex,
            OPENHUB_VAR_DIR=str(workdir / "var"),
            PYTHONPATH=str(ROOT),
        )
        with served(env, workers=workers) as (server, port):
            backends_ = postgres_backends(database)
            cpu_before, busy_before = process_tree_cpu(server.pid), machine_busy()
            pg_before, redis_before, own_before = pids_cpu(backends_), pids_cpu([redis_pid]), own_cpu()
            latencies, statuses, duration = asyncio.run(load(port, seconds, warmup, concurrency))
            server_cpu = process_tree_cpu(server.pid) - cpu_before
            backends_ = backends_ + [p for p in postgres_backends(database) if p not in backends_]
            pg_cpu, redis_cpu = pids_cpu(backends_) - pg_before, pids_cpu([redis_pid]) - redis_before
            load_cpu = own_cpu() - own_before
            busy_after = machine_busy()
            busy = (busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1])
        import sqlalchemy

        engine = sqlalchemy.create_engine(database)
        with engine.connect() as conn:
            stored = conn.exec_driver_sql("SELECT count(*) FROM messages").scalar()
        engine.dispose()
    accepted = statuses.get(202, 0)
    if not accepted:  # a refused request is fast: figures of refusals would look like a fast ingress
        raise SystemExit(f"no request was accepted: {statuses}")
    return {
        "workers": workers,
        "concurrency": concurrency,
        "seconds": duration,
        "accepted": accepted,
        "accepted_per_s": accepted / duration,
        "p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
        "p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
        "mean_ms": statistics.mean(latencies) * 1000 if latencies else None,
        "other_statuses": {k: v for k, v in statuses.items() if k != 202},
        "stored_total": stored,
        # CPU per request (warm-up included) of the ingress processes, of the PostgreSQL backends
        # serving its database, of the private redis-server and of the load generator; and how
        # busy the whole (shared) machine was
        "ingress_cpu_ms_per_request": server_cpu * 1000 / max(1, stored),
        "postgres_cpu_ms_per_request": pg_cpu * 1000 / max(1, stored),
        "redis_cpu_ms_per_request": redis_cpu * 1000 / max(1, stored),
        "loadgen_cpu_ms_per_request": load_cpu * 1000 / max(1, stored),
        "machine_busy": round(busy, 2),
    }


def record(results: list[dict], args: argparse.Namespace) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    rows = "\n".join(
        f"| {r['workers']} | {r['concurrency']} | {r['accepted_per_s']:.0f} | {r['p50_ms']:.1f} | "
        f"{r['p99_ms']:.1f} | {r['ingress_cpu_ms_per_request']:.2f} | "
        f"{r['postgres_cpu_ms_per_request']:.2f} | {r['machine_busy']:.2f} | "
        f"{r['other_statuses'] or '-'} |"
        for r in results
    )
    section = (
        f"{SECTION}\n\n"
        f"`POST /api/v1/messages/customer/setCustomer` (persisted in PostgreSQL, chain published to Redis, "
        f"no worker running), closed-loop load generator on loopback with N keep-alive "
        f"connections, {args.seconds:.0f} s measured after {args.warmup:.0f} s warm-up; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, recorded "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
        f"Reproduce: `.venv/bin/python bench/ingress.py --workers {' '.join(map(str, args.workers))} "
        f"--seconds {args.seconds:.0f} --concurrency {' '.join(map(str, args.concurrency))} --record`.\n"
        "CPU columns are CPU milliseconds per stored message (ingress processes; PostgreSQL backends of the "
        "benchmark's database); busy is the share of the whole machine's CPU in use during the run.\n\n"
        "| uvicorn workers | connections | accepted/s | p50 ms | p99 ms | ingress CPU ms | PG CPU ms | "
        "machine busy | other answers |\n"
        "|---|---|---|---|---|---|---|---|---|\n" + rows + "\n\n" + (args.note.strip() + "\n\n" if args.note else "")
    )
    if SECTION in text:
        start = text.index(SECTION)
        following = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[following + 1 :] if following != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--record", action="store_true", help="write the figures into bench/RESULTS.md")
    parser.add_argument("--note", default="", help="a paragraph recorded under the table")
    args = parser.parse_args()
    import tempfile

    results = []
    for concurrency in args.concurrency:
        for workers in args.workers:
            with tempfile.TemporaryDirectory(prefix="openhub-bench-") as tmp:
                result = bench(workers, args.seconds, args.warmup, concurrency, Path(tmp))
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.record:
        record(results, args)


if __name__ == "__main__":
    main()
