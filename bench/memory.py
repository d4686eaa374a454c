"""Worker memory over a long run (issue 10): RSS must stay flat, within 10 %, across 100,000 messages.

    PYTHONPATH=. .venv/bin/python bench/memory.py                       # 100,000 messages, chain mode
    PYTHONPATH=. .venv/bin/python bench/memory.py --messages 20000 --route bench.fused

Not a test, not run in CI. A fresh PostgreSQL database and a private redis-server, one
`celery -A tasks worker -B` (prefork, concurrency 2, no max-tasks-per-child: the pool processes
live for the whole run), the 3-step route of bench/flows.py against a local keep-alive no-op
server. Messages go in with submit_many in batches of 500, keeping at most --backlog unfinished.
Every --every finished messages it prints the resident set size (VmRSS) of the worker's main
process and of each of its children (the two pool processes and the embedded beat). The verdict
compares the last sample with the first one after the warm-up (--warmup messages: imports, pools
and caches fill up first).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peers import Env, Poller  # noqa: E402
from bench.throughput import noop_server  # noqa: E402
from tests.support.backends import postgres_database  # noqa: E402
from tests.support.workers import Worker  # noqa: E402


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def soak(env: Env, args: argparse.Namespace) -> list[tuple[int, float, list[float]]]:
    import openhub

    worker = Worker(env.env, env.workdir, beat=True, concurrency=2).start()
    poller = Poller(env.url, "SELECT count(*) FROM messages WHERE state = 'OK'")
    samples: list[tuple[int, float, list[float]]] = []
    submitted, done, started = 0, 0, time.monotonic()
    try:
        next_sample = args.warmup
        while done < args.messages:
            while submitted < args.messages and submitted - done < args.backlog:
                batch = min(500, args.messages - submitted)
                openhub.submit_many(
                    [
                        {"route": args.route, "payload": {"i": i}, "source_system": "BENCH", "correlation_id": f"m-{i}"}
                        for i in range(submitted, submitted + batch)
                    ]
                )
                submitted += batch
            poller.wait(min(done + 500, submitted), timeout=600)
            done = poller.conn.exec_driver_sql(poller.query).scalar()
            if done >= next_sample or done >= args.messages:
                children = sorted(worker.child_pids())
                sample = (done, rss_mb(worker.process.pid), [rss_mb(p) for p in children])
                samples.append(sample)
                print(
                    f"{done:7d} done  {time.monotonic() - started:6.0f} s  main {sample[1]:6.1f} MB  "
                    f"children {' '.join(f'{c:6.1f}' for c in sample[2])} MB  pids {children}",
                    flush=True,
                )
                next_sample += args.every
    finally:
        worker.stop()
        poller.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--route", default="bench.flow", help="bench.flow (chain mode) or bench.fused")
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--every", type=int, default=5_000)
    parser.add_argument("--backlog", type=int, default=2_000)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="openhub-memory-"))
    http_port, server = noop_server()
    try:
        with postgres_database("openhub_memory") as url:
            env = Env(workdir, http_port, url)
            try:
                samples = soak(env, args)
            finally:
                env.redis.stop()
    finally:
        server.terminate()

    first, last = samples[0], samples[-1]
    total = lambda s: s[1] + sum(s[2])  # noqa: E731
    growth = (total(last) - total(first)) / total(first) * 100
    print(
        f"\n{args.messages} messages on {args.route}: worker RSS (main + children) {total(first):.1f} MB after "
        f"{first[0]} messages, {total(last):.1f} MB after {last[0]}: {growth:+.1f} % "
        f"({'within' if abs(growth) <= 10 else 'NOT within'} 10 %); main {first[1]:.1f} -> {last[1]:.1f} MB, "
        f"largest child {max(first[2]):.1f} -> {max(last[2]):.1f} MB"
    )


if __name__ == "__main__":
    main()
