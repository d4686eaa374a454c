"""What "never prefetch" would cost: openhub's throughput with Celery's worker_disable_prefetch, against
the shipped settings (acks_late, worker_prefetch_multiplier=1), measured in the same run.

    PYTHONPATH=. .venv/bin/python bench/prefetch.py [--messages 1000] [--rounds 3] [--concurrency 2]

One private redis-server, one fresh PostgreSQL database, a local no-op HTTP server, the bench.flow
route (three HTTP steps). Each round runs both variants one after the other, each on a fresh worker
(`celery -A tasks worker`, prefork), alternating which goes first; prints messages/s per round and
the ratio disable_prefetch / shipped (median and spread over the rounds). Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.throughput import noop_server, run_openhub  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()

    from tests.support.backends import RedisServer, activate, postgres_database
    from tests.support.workers import Worker

    workdir = Path(tempfile.mkdtemp(prefix="openhub-prefetch-"))
    http_port, server = noop_server()
    redis_server = RedisServer.start(workdir / "redis")
    variants = {"shipped": [], "disable_prefetch": ["--disable-prefetch"]}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    try:
        with postgres_database("openhub_prefetch") as url:
            env = {
                "OPENHUB_DATABASE_URL": url,
                "OPENHUB_BROKER_URL": redis_server.url,
                "OPENHUB_ROUTES": "bench.flows",
                "OPENHUB_VAR_DIR": str(workdir / "var"),
                "BENCH_HTTP_URL": f"http://127.0.0.1:{http_port}/",
            }
            activate({k: v for k, v in env.items() if k.startswith("OPENHUB_")})  # BENCH_*: the workers'
            from openhub.store.migrate import upgrade

            upgrade(url)
            for n in range(args.rounds):
                order = list(variants) if n % 2 == 0 else list(variants)[::-1]
                for name in order:
                    worker = Worker(env, workdir / f"{name}{n}", beat=False, concurrency=args.concurrency)
                    worker.args += variants[name]
                    worker.start()
                    try:
                        run_openhub(100)  # warm-up
                        rates[name].append(run_openhub(args.messages))
                    finally:
                        worker.stop()
                    print(
                        f"round {n + 1} {name:16s}: {rates[name][-1]:7.1f} messages/s (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    finally:
        redis_server.stop()
        server.terminate()
    ratios = [d / s for d, s in zip(rates["disable_prefetch"], rates["shipped"])]
    print(
        f"messages per variant and round: {args.messages}, concurrency {args.concurrency} (prefork), "
        f"{os.cpu_count()} cores, {args.rounds} rounds"
    )
    for name, values in rates.items():
        print(
            f"{name:16s}: median {statistics.median(values):7.1f} messages/s "
            f"(min {min(values):.1f}, max {max(values):.1f})"
        )
    print(
        f"ratio disable_prefetch / shipped: median {statistics.median(ratios):.2f} "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
