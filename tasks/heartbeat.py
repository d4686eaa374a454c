"""Worker liveness: touch a file on every worker heartbeat (Kubernetes probes its age).

Celery's heartbeat is sent from the consumer's event loop every few seconds, so the file goes
stale when the worker stops consuming (a hung loop, a lost broker connection), not only when
the process dies.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery.signals import heartbeat_sent, worker_ready


def _touch(**_: object) -> None:
    Path(os.environ.get("OPENHUB_WORKER_HEARTBEAT_FILE", "/tmp/openhub-worker.heartbeat")).touch()


worker_ready.connect(_touch, weak=False)
heartbeat_sent.connect(_touch, weak=False)
