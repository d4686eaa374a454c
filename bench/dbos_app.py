"""Variant (d) of bench/peers.py: the same 3-step route body as a DBOS Transact workflow.

    python bench/dbos_app.py SYSTEM_DATABASE_URL [CONCURRENCY]   # one worker process; peers.py starts two

Each step makes the one HTTP call of bench/flows.py with the same pooled httpx client.
The queue has worker_concurrency=CONCURRENCY per process (default 1; peers.py gives each of its
two processes half the Celery worker's concurrency) and a 10 ms polling interval (DBOS's default
is 1 s, which would cap a 1-at-a-time worker at ~1 workflow/s). DBOS runs each workflow in a
thread of an unbounded executor, so CONCURRENCY workflows are CONCURRENCY threads.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dbos import DBOS, DBOSConfig

from bench.flows import http_call

QUEUE = "peers"
VERSION = "bench"


@DBOS.step()
def first(i: int) -> None:
    """Step 1."""
    http_call(f"first/{i}")


@DBOS.step()
def second(i: int) -> None:
    """Step 2."""
    http_call(f"second/{i}")


@DBOS.step()
def third(i: int) -> None:
    """Step 3."""
    http_call(f"third/{i}")


@DBOS.workflow(name="peers_flow")
def flow(i: int) -> None:
    """The route: three steps, each checkpointed by DBOS."""
    first(i)
    second(i)
    third(i)


def main() -> None:
    config: DBOSConfig = {
        "name": "openhub-peers",
        "system_database_url": sys.argv[1],
        "application_version": VERSION,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=0.01, on_conflict="always_update")
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
