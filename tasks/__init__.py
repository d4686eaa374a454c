"""The Celery application: `celery -A tasks worker|beat|flower`.

Thin adapters only: each task loads ids, calls the engine and returns. One task per route step,
named `openhub.<service>.<operation>.<step>`, plus the poller `openhub.poll` and the sender of
confirmations `openhub.confirm`.
"""

import logging

from openhub import concurrency
from openhub.dispatch import celery_app

from .steps import register_step_tasks
from .store_gate import StoreGate
from . import poll  # noqa: F401 - registers openhub.poll and openhub.chain_failed
from . import heartbeat  # noqa: F401 - worker liveness file

# `-P gevent`: kombu was imported before gevent finished patching (openhub/concurrency.py); rebind
# what it took unpatched before the worker polls the broker with it.
concurrency.repair_early_imports()

app = celery_app()
register_step_tasks(app)
app.steps["consumer"].add(StoreGate)  # no task taken while the message store is away

# httpx logs each request at INFO with its full URL, a webhook's or an external system's credentials
# included (user:password@, ?token=): the hub's own lines say what was called, redacted.
logging.getLogger("httpx").setLevel(logging.WARNING)

__all__ = ["app"]
