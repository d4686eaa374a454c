"""Variant (d) of bench/peers.py: the same 3-step route body as a DBOS Transact workflow.

    python bench/dbos_app.py SYSTEM_DATABASE_URL   # one worker process; peers.py starts two

Each step makes the one no-op HTTP call of bench/flows.py with the same pooled httpx client.
The queue has worker_concurrency=1 per process (two processes = the Celery worker's
concurrency 2) and a 10 ms polling interval (DBOS's default is 1 s, which would cap a
1-at-a-time worker at ~1 workflow/s).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dbos import DBOS, DBOSConfig  # noqa: E402

from bench.flows import http_call  # noqa: E402

QUEUE = "peers"
VERSION = "bench"


@DBOS.step()
def first(i: int) -> None:
    """Step 1."""
    http_call()


@DBOS.step()
def second(i: int) -> None:
    """Step 2."""
    http_call()


@DBOS.step()
def third(i: int) -> None:
    """Step 3."""
    http_call()


@DBOS.workflow(name="peers_flow")
def flow(i: int) -> None:
    """The route: three steps, each checkpointed by DBOS."""
    first(i)
    second(i)
    third(i)


def main() -> None:
    config: DBOSConfig = {"name": "openhub-peers", "system_database_url": sys.argv[1],
                          "application_version": VERSION, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=1, polling_interval_sec=0.01, on_conflict="always_update")
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
