"""Worker liveness: a file for Kubernetes, and the store heartbeat of the worker's main process.

Celery's heartbeat is sent from the consumer's event loop every few seconds; each one touches a
file, so the file goes stale when the worker stops consuming (a hung loop, a lost broker
connection), not only when the process dies. Kubernetes probes its age.

The main process takes the broker's deliveries (the Redis broker notes it as their holder), so it
heartbeats in the store like the pool processes that run steps: when it is witnessed dead, the
poller hands what it had taken back to the queue (openhub.celery.redisbroker).
"""

from __future__ import annotations

import os
from pathlib import Path

from celery.signals import heartbeat_sent, worker_ready

from openhub.store import workers


def _touch(**_: object) -> None:
    Path(os.environ.get("OPENHUB_WORKER_HEARTBEAT_FILE", "/tmp/openhub-worker.heartbeat")).touch()


def _ready(**_: object) -> None:
    _touch()
    # A store away at start: no task is taken until it is back; each beat reads whether an operator holds it.
    from . import HUB  # the worker's hub, built when the app was (tasks/__init__.py)

    workers.start_heartbeat(HUB.settings, keep_trying=True, consumer=True)


worker_ready.connect(_ready, weak=False)
heartbeat_sent.connect(_touch, weak=False)
