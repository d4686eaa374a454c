"""A worker that cannot reach its message store takes no task from the broker until it can again.

A step task needs the store before its call (to take the lease) and after it (to record the
outcome): a task taken while the store is away waits in the worker, and a worker that dies
meanwhile takes it along. So while the main process's own heartbeat (openhub.workers) fails or is
stuck, the worker stops consuming: a consumer bootstep makes the task channel's `can_consume` answer
False, the way Celery's own `worker_disable_prefetch` holds back deliveries, and the tasks stay in the
broker's queue for workers that can record them. The tasks it already took run and wait for the
store in the engine. When a heartbeat reaches the store again, the worker consumes again.

It says so in its log (WARNING when it stops, INFO when it resumes) and, with
OPENHUB_WORKER_METRICS=HOST:PORT, on its own Prometheus endpoint: `openhub_worker_taking_tasks`
(1, or 0 while the store is away) and `openhub_worker_store_pauses_total`.
"""

from __future__ import annotations

import logging
import threading
from types import MethodType
from typing import Any

from celery import bootsteps
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from openhub import workers
from openhub.config import get_settings

log = logging.getLogger("openhub.tasks.store_gate")

REGISTRY = CollectorRegistry(auto_describe=True)  # the worker's own: none of the ingress's series
TAKING = Gauge("openhub_worker_taking_tasks", "1 while this worker takes tasks, 0 while its message store is away.",
               registry=REGISTRY)
PAUSES = Counter("openhub_worker_store_pauses", "Times this worker stopped taking tasks because its message store "
                 "was away.", registry=REGISTRY)
TAKING.set(1)

_lock = threading.Lock()
_served = False
_paused = False


def taking() -> bool:
    """Whether this worker may take a task now; notes (log, metrics) each change."""
    global _paused
    reachable = workers.store_reachable()
    if reachable == _paused:  # a change: said once, whichever thread asks
        with _lock:
            if reachable == _paused:
                _paused = not reachable
                TAKING.set(int(reachable))
                if reachable:
                    log.info("the message store is back: taking tasks again")
                else:
                    PAUSES.inc()
                    log.warning("the message store cannot be reached: taking no new task until it can "
                                "(the broker keeps them)")
    return reachable


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
        qos = c.task_consumer.channel.qos
        can_consume = qos.can_consume

        def gated(self: Any) -> bool:
            return taking() and can_consume()

        qos.can_consume = MethodType(gated, qos)
