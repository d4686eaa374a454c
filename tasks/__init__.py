"""The Celery application: `celery -A tasks worker|beat|flower`.

Thin adapters only: each task loads ids, calls the engine and returns. One task per route step,
named `openhub.<service>.<operation>.<step>`, plus the poller `openhub.poll` and the sender of
confirmations `openhub.confirm`.
"""

from openhub.dispatch import celery_app

from .steps import register_step_tasks
from . import poll  # noqa: F401 - registers openhub.poll and openhub.chain_failed
from . import heartbeat  # noqa: F401 - worker liveness file

app = celery_app()
register_step_tasks(app)

__all__ = ["app"]
