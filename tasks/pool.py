"""A gevent pool only in a process gevent patched first (openhub/core/concurrency.py).

`celery -A tasks worker -P gevent` patches the standard library before it imports anything else. The
same pool chosen any other way (`worker_pool = "gevent"` in a configuration, `app.worker_main([...,
"-P", "gevent"])`) is never patched: its greenlets would share one thread over blocking sockets, so
one slow call or one poll of the broker would stop every step of the process. Such a worker refuses
to start, saying how to start it, instead of hanging.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from openhub.core import concurrency
from openhub.core.errors import ConfigurationError

NOT_PATCHED = (
    "the gevent pool needs the process monkey-patched before anything else is imported, and this one "
    "is not: start the worker with `celery -A tasks worker -P gevent` (Celery's command line patches "
    "first), not with worker_pool in a configuration or app.worker_main()"
)


class GeventPatched(bootsteps.Step):
    """Refuses, while the worker is built, a gevent pool in an unpatched process."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        pool = getattr(worker, "pool_cls", None)
        if getattr(pool, "__module__", "") == "celery.concurrency.gevent" and not concurrency.green():
            raise ConfigurationError(NOT_PATCHED)
