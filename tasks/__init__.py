"""The Celery application: `celery -A tasks worker|beat|flower`.

Thin adapters only: each task loads ids, calls the engine and returns. One task per route step,
named `openhub.<service>.<operation>.<step>`, plus the poller `openhub.poll` and the sender of
confirmations `openhub.confirm`.
"""

import logging

from openhub import concurrency
from openhub.dispatch import celery_app

from .pool import GeventPatched
from .steps import register_step_tasks
from . import poll  # noqa: F401 - registers openhub.poll and openhub.chain_failed
from . import heartbeat  # noqa: F401 - worker liveness file

# `-P gevent`: Celery's default app imported kombu before gevent finished patching (openhub/concurrency.py);
# rebind what it took unpatched (time.sleep of connection retries, queue.LifoQueue of its pools).
concurrency.repair_early_imports()

app = celery_app()
register_step_tasks(app)
app.steps["worker"].add(GeventPatched)  # -P gevent in a process gevent did not patch: refuse

# httpx logs each request at INFO with its full URL, a webhook's or an external system's credentials
# included (user:password@, ?token=): the hub's own lines say what was called, redacted.
logging.getLogger("httpx").setLevel(logging.WARNING)

__all__ = ["app"]
