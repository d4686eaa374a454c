"""Which kind of Celery pool runs this process's steps, and what the gevent pool needs from the hub.

`celery worker -P gevent` monkey-patches the standard library before anything else runs, so a
patched `socket` module is how any module here tells that steps run as greenlets of one thread
(`green()`), whatever started the process. Under greenlets:

- a step's timeout is a `gevent.Timeout` in its own greenlet (`step_time_limit`): Celery's gevent pool
  keeps only the hard time limit, and SIGALRM belongs to the whole process, not to one step;
- the store is entered by at most a few greenlets at a time (`store_gate`): SQLite's busy wait is a C
  loop that would block every greenlet of the process while another one holds the write lock, and
  hundreds of greenlets would otherwise queue inside SQLAlchemy's pool and time out there. The
  heartbeat goes ahead of them all: behind 500 steps in line it fell more than the fence behind, and
  the process refused its own steps (openhub/store/workers.py);
- kombu and redis-py functions bound before the patching ended are rebound (`repair_early_imports`).

The last one is why `-P gevent` ran no step at all. While gevent patches `threading` it scans the
existing locks, and `isinstance` on one of Celery's lazy proxies makes Celery's default app read its
configuration: Celery's app and `celeryconfig.py` are imported before gevent has patched `time` and
`select`. `celeryconfig.py` imported openhub's broker transports then, and kombu's transports keep
`from time import sleep` and `select.select` as module globals, so the worker's pidbox greenlet polled
the broker with the real, blocking `sleep` (filesystem transport) or `select` (Redis) and the consumer
greenlet never ran. `celeryconfig.py` now names the transports instead of importing them; what Celery's
own app still takes early (kombu's retry `sleep`, its pools' `LifoQueue`, amqp's `Queue`) is rebound.
A gevent pool in a process that was not patched at all refuses to start (tasks/pool.py).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Libraries whose modules may have been imported in the middle of gevent's patching (see above).
EARLY_IMPORTED = ("kombu", "celery", "amqp", "redis", "billiard", "vine")
SQLITE_GATE = 1  # one transaction of the process at a time: SQLite has one writer, and waits for it in C
_gates: dict[str, Any] = {}
_depth = threading.local()  # per greenlet once patched: transactions this greenlet has open


def green() -> bool:
    """Whether this process runs its steps as gevent greenlets (`celery worker -P gevent`)."""
    gevent = sys.modules.get("gevent.monkey")
    return gevent is not None and gevent.is_module_patched("socket")


def repair_early_imports() -> int:
    """Rebind the standard library functions that kombu, Celery and redis-py took as module globals
    before gevent had patched them (under `-P gevent`); returns how many names were rebound."""
    if not green():
        return 0
    from gevent import monkey

    patched: dict[int, Any] = {}
    for module_name, originals in monkey.saved.items():
        module = sys.modules.get(module_name)
        for name, original in originals.items():
            current = getattr(module, name, None) if module is not None else None
            if callable(original) and current is not None and current is not original:
                patched[id(original)] = current
    rebound = 0
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.partition(".")[0] not in EARLY_IMPORTED:
            continue
        for name, value in list(vars(module).items()):
            replacement = patched.get(id(value))
            if replacement is not None and not isinstance(value, type(sys)):
                setattr(module, name, replacement)
                rebound += 1
    return rebound


@contextmanager
def step_time_limit(seconds: float, expired: type[BaseException], message: str) -> Iterator[None]:
    """Raise `expired(message)` in this greenlet if the block runs longer than `seconds`."""
    from gevent import Timeout

    with Timeout(seconds, expired(message)):
        yield


class _Gate:
    """At most `size` greenlets inside; the others wait in line, and one that comes `first` (the
    heartbeat) waits ahead of every ordinary one. A slot freed is handed to the next in line at once."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.lines: tuple[deque, deque] = (deque(), deque())  # those first, then the others

    def enter(self, first: bool) -> None:
        if self.free and not (self.lines[0] or (not first and self.lines[1])):
            self.free -= 1
            return
        from gevent.event import Event

        turn = Event()
        line = self.lines[0 if first else 1]
        line.append(turn)
        try:
            turn.wait()
        except BaseException:  # a timeout or kill while waiting: give back a slot it was handed
            if turn.is_set():
                self.leave()
            else:
                line.remove(turn)
            raise

    def leave(self) -> None:
        line = self.lines[0] or self.lines[1]
        if line:
            line.popleft().set()
        else:
            self.free += 1


@contextmanager
def store_gate(url: str, size: int, first: bool = False) -> Iterator[None]:
    """Let at most `size` greenlets at a time into the store at `url` (a greenlet already inside enters
    again at once: a nested transaction never waits for itself); `first` waits ahead of the others.
    Only for a process under gevent."""
    depth = getattr(_depth, "value", 0)
    if depth:
        _depth.value = depth + 1
        try:
            yield
        finally:
            _depth.value = depth
        return
    gate = _gates.get(url)
    if gate is None:
        gate = _gates.setdefault(url, _Gate(size))
    gate.enter(first)
    _depth.value = 1
    try:
        yield
    finally:
        _depth.value = 0
        gate.leave()
