"""CPU per HTTP call of the ways a gevent process can hold its httpx clients, with hundreds of calls in flight.

    PYTHONPATH=. .venv/bin/python bench/http_clients.py [--greenlets 375] [--calls 6000] [--latency-ms 200]
        [--ways one,sharded16,sharded31,held,httpcall] [--profile DIR]

One gevent process (monkey-patched first) runs --greenlets greenlets, each making calls one after another to
bench/slow_server.py (its own process, answering after --latency-ms) until --calls are made, once per way:

  one        one `httpx.Client` for the whole process (the obvious step body)
  sharded16  round 16 clients: `openhub.outbound.http.pooled_client()` (GREEN_SHARDS)
  sharded31  round 31 clients of keep-alive 2000: bench/flows.py's sharded batch at 2 x 250 (500 // 16)
  held       `openhub.outbound.http.held_client()`: a client per call in flight (HttpCall's since issue 42)
  httpcall   `HttpCall().post(ctx, ...)` with a StepContext outside a hub's run (no store, no heartbeat):
             headers, redaction notes, the fence check and the outcome mapping on top of `held`

and prints each way's process CPU ms per call (time.process_time) and calls/s; with --profile DIR, each
way's cProfile (DIR/WAY.prof, and its top functions printed). bench/peers.py measures the same inside
Celery workers; this isolates the client.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import pstats  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import httpx  # noqa: E402

from openhub.core.context import MessageInfo, StepContext  # noqa: E402
from openhub.outbound import http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def ways(url: str) -> dict:
    one = httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=2000))
    limits31 = httpx.Limits(max_connections=None, max_keepalive_connections=2000)
    shards31 = [httpx.Client(limits=limits31) for _ in range(31)]
    turn = itertools.count()
    call = http.HttpCall(timeout=30)

    def ctx(i: int) -> StepContext:
        at = datetime.now(timezone.utc)
        message = MessageInfo(i, f"c-{i}", "bench", "bench", "flow", None, None, None, 0, at, at, None)
        return StepContext(
            payload={},
            message=message,
            idempotency_key=f"bench/c-{i}/first",
            attempt=1,
            redelivered=False,
            custom_data={},
        )

    def held(i: int) -> None:
        with http.held_client() as client:
            client.post(f"{url}first/{i}", content=b"{}").raise_for_status()

    return {
        "one": lambda i: one.post(f"{url}first/{i}", content=b"{}").raise_for_status(),
        "sharded16": lambda i: http.pooled_client().post(f"{url}first/{i}", content=b"{}").raise_for_status(),
        "sharded31": lambda i: shards31[next(turn) % 31].post(f"{url}first/{i}", content=b"{}").raise_for_status(),
        "held": held,
        "httpcall": lambda i: call.post(ctx(i), f"{url}first/{i}", content=b"{}"),
    }


def run(fn, greenlets: int, calls: int) -> tuple[float, float]:
    """(CPU ms per call, calls/s) of `calls` calls made by `greenlets` greenlets."""
    numbers = itertools.count()

    def loop() -> None:
        while (i := next(numbers)) < calls:
            fn(i)

    fn(-1)  # build the way's clients outside the measured part
    cpu, wall = time.process_time(), time.perf_counter()
    gevent.joinall([gevent.spawn(loop) for _ in range(greenlets)], raise_error=True)
    return (time.process_time() - cpu) * 1000 / calls, calls / (time.perf_counter() - wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--greenlets", type=int, default=375, help="calls in flight (375: a 2 x 250 batch run's)")
    parser.add_argument("--calls", type=int, default=6000, help="calls per way")
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--ways", default="one,sharded16,sharded31,held,httpcall")
    parser.add_argument("--profile", metavar="DIR", help="cProfile each way into DIR/WAY.prof")
    args = parser.parse_args()
    port = 20000 + (hash(time.time()) % 20000)
    server = subprocess.Popen(
        [sys.executable, "-c", f"from bench.slow_server import serve_slow; serve_slow({port}, {args.latency_ms})"],
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}_stats").raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                gevent.sleep(0.1)
        table = ways(url)
        print(f"{args.greenlets} calls in flight, {args.calls} calls per way, {args.latency_ms:g} ms each")
        print("| way | CPU ms/call | calls/s |\n|---|---|---|")
        for name in args.ways.split(","):
            profile = cProfile.Profile() if args.profile else None
            if profile:
                profile.enable()
            ms, rate = run(table[name], args.greenlets, args.calls)
            print(f"| {name} | {ms:.3f} | {rate:.0f} |", flush=True)
            if profile:
                profile.disable()
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                profile.dump_stats(str(Path(args.profile) / f"{name}.prof"))
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
                print(out.getvalue())
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
