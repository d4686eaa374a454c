"""A worker that cannot reach its message store takes no task from the broker until it can again.

A step task needs the store before its call (to take the lease) and after it (to record the
outcome): a task taken while the store is away waits in the worker, and a worker that dies
meanwhile takes it along. So while the main process's own heartbeat (openhub.store.workers) fails or is
stuck, the worker stops consuming: a consumer bootstep makes the task channel's `can_consume` answer
False, the way Celery's own `worker_disable_prefetch` holds back deliveries, and the tasks stay in the
broker's queue for workers that can record them. The tasks it already took run and wait for the
store in the engine. When a heartbeat reaches the store again, the worker consumes again.

On RabbitMQ the broker pushes deliveries (up to the prefetch count) instead of the worker fetching
them, and the channel has no `can_consume` to answer: there the gate looks every GATE_INTERVAL and
cancels the worker's task consumer while the store is away (nothing more is pushed to it; the few it
was already sent, at most its prefetch count, run and wait for the store as those taken do), and
consumes again when it is back.

It says so in its log (WARNING when it stops, INFO when it resumes) and, with
OPENHUB_WORKER_METRICS=HOST:PORT, on its own Prometheus endpoint: `openhub_worker_taking_tasks`
(1, or 0 while the store is away or an operator holds it) and `openhub_worker_store_pauses_total`.

The same gate holds a worker an operator told to finish what it has and take nothing new (`openhub workers
finish`, openhub.store.holds): its heartbeat reads the hold from the store, so the hold outlives a broker
reconnection (the gate is set on each new task consumer, and asks the heartbeat's answer). Flower and
`celery inspect stats` show it as the worker's `openhub_state` (Flower: the worker's "Other" tab):
`taking work`, `finishing: <reason>` or `store away`.
"""

from __future__ import annotations

import logging
import threading
from types import MethodType
from typing import Any

from celery import bootsteps
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from openhub.core.config import get_settings
from openhub.store import workers

log = logging.getLogger("openhub.tasks.store_gate")

REGISTRY = CollectorRegistry(auto_describe=True)  # the worker's own: none of the ingress's series
TAKING = Gauge(
    "openhub_worker_taking_tasks",
    "1 while this worker takes tasks, 0 while its message store is away.",
    registry=REGISTRY,
)
PAUSES = Counter(
    "openhub_worker_store_pauses",
    "Times this worker stopped taking tasks because its message store was away.",
    registry=REGISTRY,
)
TAKING.set(1)

GATE_INTERVAL = 0.5  # seconds between two looks at the store's reachability on a push broker (RabbitMQ)
_lock = threading.Lock()
_served = False
_paused = False
_held: str | None = None  # the operator's hold this gate last acted on


def taking() -> bool:
    """Whether this worker may take a task now (its store is there and no operator holds it); notes (log,
    metrics) each change."""
    global _paused
    reachable = workers.store_reachable()
    if reachable == _paused:  # a change: said once, whichever thread asks
        with _lock:
            if reachable == _paused:
                _paused = not reachable
                if reachable:
                    log.info("the message store is back: taking tasks again")
                else:
                    PAUSES.inc()
                    log.warning(
                        "the message store cannot be reached: taking no new task until it can (the broker keeps them)"
                    )
    held = _note_hold(workers.held())
    TAKING.set(int(reachable and held is None))
    return reachable and held is None


def _note_hold(held: str | None) -> str | None:
    """Log a change of the operator's hold, once, whichever thread sees it."""
    global _held
    if (held is None) != (_held is None):
        with _lock:
            if (held is None) != (_held is None):
                if held is None:
                    log.info("an operator let this worker take work again: taking tasks again")
                else:
                    log.warning("an operator told this worker to finish what it has (%s): taking no new task", held)
            _held = held
    return held


def state() -> str:
    """This worker's state as Flower and `celery inspect stats` show it (`openhub_state`)."""
    if not workers.store_reachable():
        return "store away"
    held = workers.held()
    return "taking work" if held is None else f"finishing: {held}"


def serve_metrics() -> None:
    """Serve REGISTRY on OPENHUB_WORKER_METRICS (HOST:PORT; empty: not served), once per process."""
    global _served
    address = get_settings().worker_metrics
    if not address or _served:
        return
    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=REGISTRY)
    _served = True
    log.info("worker metrics on http://%s:%s/metrics", host or "0.0.0.0", port)


class StoreGate(bootsteps.StartStopStep):
    """Consumer bootstep: the task channel consumes only while `taking()` (after each (re)connection)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        serve_metrics()
        qos = getattr(c.task_consumer.channel, "qos", None)
        if qos is None or not hasattr(qos, "can_consume"):  # a push broker (RabbitMQ): cancel and resume
            self._gate_pushes(c)
            return
        can_consume = qos.can_consume

        def gated(self: Any) -> bool:
            return taking() and can_consume()

        qos.can_consume = MethodType(gated, qos)

    def _gate_pushes(self, c: Any) -> None:
        consumer = c.task_consumer
        state = {"consuming": True}

        def look() -> None:
            if consumer is not c.task_consumer:  # a reconnection made a new consumer (and a new gate)
                return
            reachable = taking()
            try:
                if not reachable and state["consuming"]:
                    consumer.cancel()
                    state["consuming"] = False
                elif reachable and not state["consuming"]:
                    consumer.consume()
                    state["consuming"] = True
            except Exception as exc:
                log.info("could not %s the task consumer: %s", "resume" if reachable else "pause", exc)

        self._timer = c.timer.call_repeatedly(GATE_INTERVAL, look)

    def info(self, c: Any) -> dict[str, Any]:
        """What `celery inspect stats` (and Flower's worker page, its "Other" tab) show of the gate."""
        return {"openhub_state": state()}

    def stop(self, c: Any) -> None:
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            self._timer = None
