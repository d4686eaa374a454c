"""One Celery task per route step; the engine does the work."""

from __future__ import annotations

from celery import Celery, Task
from kombu import Queue

from openhub import engine, workers
from openhub.errors import ConfigurationError, StoreUnavailable
from openhub.model import Route
from openhub.registry import get_registry


STORE_RETRY_SECONDS = 2
STORE_RETRIES = 30


class StepFailed(Exception):
    """The step's attempt failed and the hub recorded it (retried later, or the message FAILED).

    Raised after the outcome is safely written, only so that Flower shows the task as failed.
    """


def _step_task(app: Celery, route: Route, index: int) -> Task:
    def run(self: Task, message_id: int, token: str) -> str:
        redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
        try:
            workers.start_heartbeat()  # the lease names this process; its heartbeat says it lives
            report = engine.run_step(route.name, index, message_id, token, redelivered=redelivered)
        except StoreUnavailable as exc:
            # The database restarted or is briefly away: try the same task again, same token.
            raise self.retry(exc=exc, countdown=STORE_RETRY_SECONDS, max_retries=STORE_RETRIES) from exc
        if not report.go_on:
            self.request.chain = None  # the message left PROCESSING (or this chain is stale): stop here
        if report.failed:
            raise StepFailed(f"message {message_id}: {report.outcome}: {report.error or ''}".strip())
        return report.outcome

    run.__name__ = route.steps[index].key
    run.__doc__ = f"Step {route.steps[index].key} of route {route.name}."
    return app.task(name=route.task_name(route.steps[index]), bind=True, throws=(StepFailed,))(run)


def register_step_tasks(app: Celery) -> None:
    """Register every step of every loaded route, and declare the queues the routes name."""
    limit = app.conf.get("visibility_timeout") or 3600
    queues = {app.conf.task_default_queue}
    for route in get_registry().routes.values():
        for index, item in enumerate(route.steps):
            timeout = item.timeout.total_seconds() if item.timeout else None
            if timeout and timeout >= limit:
                raise ConfigurationError(f"step {route.task_name(item)} may run {timeout:.0f} s, longer than the "
                                         f"broker's visibility timeout {limit:.0f} s (OPENHUB_VISIBILITY_TIMEOUT)")
            queues.add(item.queue or route.queue or app.conf.task_default_queue)
            _step_task(app, route, index)
    app.conf.task_queues = [Queue(q) for q in sorted(queues)]
