"""The Celery application: `celery -A tasks worker|beat|flower`.

Thin adapters only: each task loads ids, calls the engine and returns. One task per route step,
named `openhub.<service>.<operation>.<step>`, plus the poller `openhub.poll` and the sender of
confirmations `openhub.confirm`.
"""

import logging

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_shutdown,
)

from openhub.celery.dispatch import celery_app
from openhub.core import concurrency, logs, tracing
from openhub.core.live import set_log_level
from openhub.engine.hub import current, serve_as

from . import (
    heartbeat,  # noqa: F401 - worker liveness file
    poll,  # noqa: F401 - registers openhub.poll and openhub.chain_failed
)
from .pool import GeventPatched
from .steps import register_step_tasks
from .store_gate import StoreGate

# `-P gevent`: Celery's default app imported kombu before gevent finished patching (openhub/core/concurrency.py);
# rebind what it took unpatched (time.sleep of connection retries, queue.LifoQueue of its pools).
concurrency.repair_early_imports()

# The process's hub: its settings and routes from the OPENHUB_* environment, publishing to Celery.
HUB = current()
app = celery_app()
register_step_tasks(app, HUB)
# Workers and beat trace when OTEL_TRACES_EXPORTER says so (openhub/core/tracing.py); a prefork pool's
# children inherit the instrumentation, and the SDK starts its export thread anew in each.
tracing.setup("openhub-worker")
app.steps["consumer"].add(StoreGate)  # no task taken while the message store is away
app.steps["worker"].add(GeventPatched)  # -P gevent in a process gevent did not patch: refuse

# httpx logs each request at INFO with its full URL, a webhook's or an external system's credentials
# included (user:password@, ?token=): the hub's own lines say what was called, redacted.
logging.getLogger("httpx").setLevel(logging.WARNING)


def _message_fields(logger: logging.Logger, **_: object) -> None:
    # Lines about a message carry its ids, as text or JSON (OPENHUB_LOG_FORMAT; openhub/core/logs.py).
    logs.install(logger.handlers, HUB.settings.log_format)


after_setup_logger.connect(_message_fields, weak=False)
after_setup_task_logger.connect(_message_fields, weak=False)
# A pool process ends without running atexit handlers: export the spans it still holds first.
worker_process_shutdown.connect(lambda **_: tracing.flush(), weak=False)


def _serve_as(kind: str) -> None:
    # The settings in force on a worker's processes are kept for `openhub config` by their first refresh
    # (openhub.engine.hub.Hub.refresh): never here, in a main process whose pool and beat are forked from it
    # after (SQLite connections must not cross a fork).
    serve_as(kind)
    set_log_level(HUB.settings.log_level)


# Beat keeps no snapshot: it runs no engine code and reads no live setting (it sends the poll tick every
# OPENHUB_POLL_INTERVAL, which needs a restart); what is in force for the hub's work is on the workers' rows.
worker_init.connect(lambda **_: _serve_as("worker"), weak=False)

__all__ = ["app"]
