"""Faults the process model (tests/support/process_model.py) injects inside a worker's processes, where no
signal, proxy or broker restart reaches: this module is one of the model's route modules (OPENHUB_ROUTES), so
every worker imports it before it forks its pool, and it does nothing unless the worker's environment asks.

`OPENHUB_TEST_SLOW_HEARTBEAT_OPEN=<seconds>`: the heartbeat's own connection to the store (openhub.store.workers,
`_OwnConnection`) takes that long to open, the first time in each process: a loaded box, where a fresh
process's first connection took most of a second (issue 33). It delays the opening, not what the heartbeat does
with it: the other connections of the process (the steps' pool, the proof's ping) open as fast as ever.

`OPENHUB_TEST_BROKER_READ_TIMEOUT=<seconds>`: the worker's outstanding read for more tasks (the Redis transport's
BRPOP) is answered empty after that long instead of kombu's 1 s, so a read is outstanding, unanswered, all that
time: a fault of the broker's timing that widens the window where a Redis restart finds the read still open
(issue 33, break 8), which is otherwise the second after each read was sent.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import event

SLOW_HEARTBEAT_OPEN = "OPENHUB_TEST_SLOW_HEARTBEAT_OPEN"
BROKER_READ_TIMEOUT = "OPENHUB_TEST_BROKER_READ_TIMEOUT"


def _slow_heartbeat_open(seconds: float) -> None:
    from openhub.store import workers

    init = workers._OwnConnection.__init__
    opened: set[int] = set()  # the processes whose heartbeat connection opened slowly once already

    def slow_init(self: Any, url: str) -> None:
        init(self, url)

        @event.listens_for(self.engine, "do_connect")
        def slow(*_: Any) -> None:
            if os.getpid() not in opened:
                opened.add(os.getpid())
                time.sleep(seconds)  # the fault injected: the connection's opening takes this long

    workers._OwnConnection.__init__ = slow_init  # type: ignore[method-assign]


def _broker_read_timeout(seconds: float) -> None:
    from openhub.celery import redisbroker

    redisbroker.Transport.brpop_timeout = seconds  # each channel takes its transport's when it opens


if os.environ.get(SLOW_HEARTBEAT_OPEN):
    _slow_heartbeat_open(float(os.environ[SLOW_HEARTBEAT_OPEN]))
if os.environ.get(BROKER_READ_TIMEOUT):
    _broker_read_timeout(float(os.environ[BROKER_READ_TIMEOUT]))
