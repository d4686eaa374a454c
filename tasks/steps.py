"""One Celery task per route step (per run of steps for a fused route; one per batch route, carrying many
messages); the engine (openhub.engine.batch for a batch) does the work."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from functools import partial
from typing import Callable, ContextManager, Iterator, TypeVar

from celery import Celery, Task
from celery.exceptions import SoftTimeLimitExceeded
from kombu import Queue

from openhub.celery.dispatch import batch_options, batch_task_name, task_end, task_name, task_options
from openhub.core import concurrency
from openhub.core.errors import ConfigurationError, StepFailed, StoreUnavailable
from openhub.core.model import Route
from openhub.engine import batch, engine
from openhub.engine.hub import Hub
from openhub.store import workers

from .exceptions import translate

STORE_RETRY_SECONDS = 2
STORE_RETRIES = 30
T = TypeVar("T")


@contextmanager
def step_alarm(seconds: float, what: str = "the step") -> Iterator[None]:
    """One step's soft time limit inside a fused task, whose Celery limit covers all its steps (or the
    deadline of `what` else runs inside a task: a confirmer's).

    Raises what Celery's own soft limit raises, so an overrunning step ends as it does in chain mode.
    A signal needs the process's main thread (prefork and solo pools); elsewhere the task's limit only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise SoftTimeLimitExceeded(f"{what} ran over its timeout of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def step_greenlet_limit(seconds: float, what: str = "the step") -> Iterator[None]:
    """One step's soft time limit in the gevent pool, which keeps only Celery's hard limit: a
    gevent.Timeout in the step's own greenlet, raising what Celery's soft limit raises elsewhere."""
    with concurrency.step_time_limit(seconds, SoftTimeLimitExceeded, f"{what} ran over its timeout of {seconds:g} s"):
        yield


def confirmer_deadline() -> Callable[[float], ContextManager[None]]:
    """How a task keeps a confirmer's overall deadline (OPENHUB_CONFIRM_TIMEOUT, openhub.confirm): a
    greenlet timeout under gevent, else SIGALRM where the task runs on the main thread (prefork, solo);
    on another thread nothing can interrupt it, and its renewed sending lease alone keeps it sent once."""
    limit = step_greenlet_limit if concurrency.green() else step_alarm
    return partial(limit, what="the confirmer")


def step_limit(steps: int) -> Callable[[float], ContextManager[None]] | None:
    """How a task of `steps` steps keeps each step's timeout: a greenlet timeout under gevent; else
    SIGALRM for a fused task, and none for a task of one step (Celery's soft limit is the step's)."""
    if concurrency.green():
        return step_greenlet_limit
    return step_alarm if steps > 1 else None


def _carried(task: Task, hub: Hub, work: Callable[[bool], T]) -> T:
    """Run a step task's `work` (told whether the broker delivered the task again) with this process's
    heartbeat going: the leases it takes name this process, and its heartbeat says it lives.

    The database restarted or briefly away before a lease was taken: the same task is tried again later,
    same tokens (steps it already carried through are found OK and skipped).
    """
    redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
    workers.start_heartbeat(hub.settings)
    try:
        return work(redelivered)
    except StoreUnavailable as exc:
        raise task.retry(exc=exc, countdown=STORE_RETRY_SECONDS, max_retries=STORE_RETRIES) from exc


def _step_task(app: Celery, hub: Hub, route: Route, index: int) -> Task:
    end = task_end(route, index)

    def run(self: Task, message_id: int, token: str) -> str:
        limit = step_limit(end - index)  # chosen when the task runs: the pool is known by then
        step, report = _carried(
            self,
            hub,
            lambda redelivered: engine.run_steps(
                route.name, index, end, message_id, token, redelivered, hub, limit, translate=translate
            ),
        )
        if not report.go_on:
            self.request.chain = None  # the message left PROCESSING (or this chain is stale): stop here
        if report.failed:
            raise StepFailed(
                f"message {message_id}: {route.steps[step].key}: {report.outcome}: {report.error or ''}".strip()
            )
        return report.shown  # what Flower lists as the task's result: "skipped: already done ..." for a step done

    run.__name__ = route.steps[index].key
    run.__doc__ = (
        f"Step {route.steps[index].key} of route {route.name}."
        if end - index == 1
        else f"Steps {', '.join(s.key for s in route.steps[index:end])} of route {route.name} (fused)."
    )
    # Not shared: a process with two apps (tests) would otherwise register each step task in both.
    return app.task(name=task_name(route, route.steps[index]), bind=True, throws=(StepFailed,), shared=False)(run)


def _batch_task(app: Celery, hub: Hub, route: Route) -> Task:
    def run(self: Task, pairs: list[tuple[int, str]], start: int = 0) -> dict[str, int]:
        # Every step run of the batch keeps its own timeout: the task's limit covers them all.
        limit = step_limit(len(pairs) * (len(route.steps) - start))
        reports = _carried(
            self,
            hub,
            lambda redelivered: batch.run_batch(
                route.name, start, [(m, t) for m, t in pairs], redelivered, hub, limit, translate=translate
            ),
        )
        # What Flower shows: how many of its messages came to what, or StepFailed naming those that failed.
        return batch.summary(reports)

    run.__name__ = f"{route.operation}_batch"
    run.__doc__ = (
        f"Batches of up to {route.batch} messages through steps {', '.join(s.key for s in route.steps)} "
        f"of route {route.name}."
    )
    return app.task(name=batch_task_name(route), bind=True, throws=(StepFailed,), shared=False)(run)


def redelivery_limit(app: Celery, hub: Hub) -> tuple[float, str]:
    """How long a task may stay unacknowledged before the broker hands it to another worker (Redis: the
    visibility timeout) or takes it from its worker (RabbitMQ: `consumer_timeout`, which closes the
    worker's channel and requeues what it held), and what to call it in an error. The worker refuses to
    start with a route whose task may run that long: a step still running would be run again."""
    if hub.settings.broker == "amqp":
        return (
            hub.settings.consumer_timeout.total_seconds(),
            "broker's consumer_timeout (RabbitMQ's rabbitmq.conf; OPENHUB_CONSUMER_TIMEOUT says what it is)",
        )
    return app.conf.get("visibility_timeout") or 3600, "broker's visibility timeout (OPENHUB_VISIBILITY_TIMEOUT)"


def register_step_tasks(app: Celery, hub: Hub) -> None:
    """Register every step of the hub's routes (and a batch route's batch task), and declare the queues
    the routes name."""
    limit, what = redelivery_limit(app, hub)
    queues = {app.conf.task_default_queue}
    for route in hub.registry.routes.values():
        if route.batch:
            timeout = batch_options(route, 0, route.batch, hub.settings)["soft_time_limit"]
            if timeout >= limit:
                raise ConfigurationError(
                    f"task {batch_task_name(route)} may run {timeout:.0f} s ({route.batch} messages, each through "
                    f"steps that may take {timeout / route.batch:.0f} s), longer than the {what} {limit:.0f} s: "
                    "give the steps shorter timeouts or the route a smaller batch"
                )
            _batch_task(app, hub, route)
        for index, item in enumerate(route.steps):
            timeout = task_options(route, index, hub.settings)["soft_time_limit"]
            if timeout >= limit:
                raise ConfigurationError(
                    f"task {task_name(route, item)} may run {timeout:.0f} s, longer than the {what} {limit:.0f} s"
                )
            queues.add(route.step_queue(item) or app.conf.task_default_queue)
            _step_task(app, hub, route, index)
    confirm = hub.settings.confirm_queue  # openhub.confirm's own queue, bound by its name alone
    app.conf.task_queues = [Queue(q) for q in sorted(queues - {confirm})] + (
        [Queue(confirm, routing_key=confirm)] if confirm and confirm not in queues else []
    )
