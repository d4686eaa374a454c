"""Synchronous route latency: what a sync route's HTTP round trip adds to the time of its steps called directly.

    PYTHONPATH=. .venv/bin/python bench/sync_latency.py [--requests 100] [--runs 3] [--record]

One fresh PostgreSQL database on 127.0.0.1:5432 (dropped afterwards), a private redis-server as the broker,
an `openhub serve` (1 uvicorn worker), one Celery worker (prefork, 2 processes) and the test suite's external
system (openhub.testing.ExternalSystem) on loopback. The route is tests/support/routes.py's `test.quote`
(two steps, each one POST to the external system; the second returns the result) in chain mode and as
`fused.quote` (both steps in one Celery task). Measured, one request at a time:

- direct: the same two step functions called in this process (two POSTs to the external system);
- sync chain / sync fused: `POST /api/v1/messages/{route}` with `Prefer: wait=30`, answered 200 with the result.

Each run sends `--requests` requests of each kind after 10 of warm-up; `--runs` runs give the spread.
`--record` writes the figures into bench/RESULTS.md under "## Synchronous routes (issue 38)".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import httpx  # noqa: E402

from bench.served import served  # noqa: E402
from openhub.testing import ExternalSystem  # noqa: E402
from tests.support.backends import TEST_SETTINGS, RedisServer, postgres_database  # noqa: E402
from tests.support.workers import Worker  # noqa: E402

KEY = "bench-" + uuid.uuid4().hex
SECTION = "## Synchronous routes (issue 38)"


def _direct(steps: list, prefix: str, n: int) -> float:
    ctx = SimpleNamespace(
        payload={"prefix": prefix, "n": 3},
        idempotency_key=f"direct-{n}",
        custom_data={},
        attempt=1,
        redelivered=False,
        check_fence=lambda: None,
    )
    started = time.perf_counter()
    result = None
    for item in steps:
        result = item.fn(ctx)
    assert result == {"quote": 30, "prefix": prefix}, result
    return time.perf_counter() - started


def _sync(client: httpx.Client, port: int, route: str, prefix: str, n: int) -> float:
    started = time.perf_counter()
    r = client.post(
        f"http://127.0.0.1:{port}/api/v1/messages/{route}",
        json={"prefix": prefix, "n": 3},
        headers={"Authorization": f"Bearer {KEY}", "X-Correlation-Id": f"{prefix}-{n}", "Prefer": "wait=30"},
    )
    elapsed = time.perf_counter() - started
    assert r.status_code == 200 and r.json()["result"] == {"quote": 30, "prefix": prefix}, r.text
    return elapsed


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered) * 1000,
        "p90": ordered[int(0.9 * (len(ordered) - 1))] * 1000,
        "mean": statistics.mean(ordered) * 1000,
    }


def bench(requests: int, runs: int, workdir: Path) -> list[dict[str, dict[str, float]]]:
    external = ExternalSystem().start()
    redis = RedisServer.start(workdir / "redis")
    results: list[dict[str, dict[str, float]]] = []
    try:
        with postgres_database("openhub_bench") as database:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENHUB_", "PROMETHEUS_"))}
            openhub_env = dict(
                TEST_SETTINGS,
                OPENHUB_DATABASE_URL=database,
                OPENHUB_BROKER_URL=redis.url,
                OPENHUB_ROUTES="tests.support.routes",
                OPENHUB_API_KEYS=f"BENCH={KEY}",
                OPENHUB_ADMIN_TOKEN="admin-" + uuid.uuid4().hex,
                OPENHUB_VAR_DIR=str(workdir / "var"),
                OPENHUB_TEST_EXTERNAL_URL=external.url,
            )
            env.update(openhub_env, PYTHONPATH=str(ROOT))
            os.environ.update(openhub_env)  # the direct calls read the external system's URL from here
            with served(env) as (_server, port), Worker(openhub_env, workdir, concurrency=2).start():
                from openhub.core.config import get_settings
                from openhub.core.registry import build_registry

                steps = list(build_registry(["tests.support.routes"], get_settings()).route("test.quote").steps)
                with httpx.Client(timeout=60) as client:
                    for run in range(runs):
                        prefix = f"/b{uuid.uuid4().hex[:8]}"
                        figures: dict[str, list[float]] = {"direct": [], "sync chain": [], "sync fused": []}
                        for n in range(requests + 10):
                            measured = n >= 10
                            d = _direct(steps, prefix, n)
                            c = _sync(client, port, "test/quote", prefix + "c", n)
                            f = _sync(client, port, "fused/quote", prefix + "f", n)
                            if measured:
                                figures["direct"].append(d)
                                figures["sync chain"].append(c)
                                figures["sync fused"].append(f)
                        results.append({k: summary(v) for k, v in figures.items()})
                        print(
                            f"run {run + 1}: "
                            + "; ".join(
                                f"{k} p50 {v['p50']:.1f} ms p90 {v['p90']:.1f} ms" for k, v in results[-1].items()
                            ),
                            flush=True,
                        )
    finally:
        redis.stop()
        external.stop()
    return results


def record(results: list[dict[str, dict[str, float]]], args: argparse.Namespace) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text()
    rows = "\n".join(
        f"| {i + 1} | {r['direct']['p50']:.1f} | {r['sync chain']['p50']:.1f} | "
        f"{r['sync chain']['p90']:.1f} | {r['sync fused']['p50']:.1f} | {r['sync fused']['p90']:.1f} | "
        f"{r['sync chain']['p50'] - r['direct']['p50']:.1f} | "
        f"{r['sync fused']['p50'] - r['direct']['p50']:.1f} |"
        for i, r in enumerate(results)
    )
    section = (
        f"{SECTION}\n\n"
        "A sync route's HTTP round trip (`POST` with `Prefer: wait=30`, answered 200 with the result) against "
        "its two steps called directly in one process; one request at a time; redis-pg backend, one "
        "`openhub serve`, one prefork worker (2 processes), the external system on loopback; "
        f"{args.requests} requests of each kind per run after 10 of warm-up; {os.cpu_count()} CPUs "
        f"(shared with other sessions' tests), recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
        f"Reproduce: `PYTHONPATH=. .venv/bin/python bench/sync_latency.py --requests {args.requests} "
        f"--runs {args.runs} --record`.\n\n"
        "| run | direct p50 ms | sync chain p50 | chain p90 | sync fused p50 | fused p90 | "
        "overhead chain (p50) | overhead fused (p50) |\n"
        "|---|---|---|---|---|---|---|---|\n" + rows + "\n"
    )
    start = text.find(SECTION)
    if start >= 0:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="openhub-sync-bench-") as tmp:
        results = bench(args.requests, args.runs, Path(tmp))
    if args.record:
        record(results, args)


if __name__ == "__main__":
    main()
