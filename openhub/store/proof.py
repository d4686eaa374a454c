"""Proof that the store was reachable just before an external call (issue 33, break 6).

A network cut does not fail a query on an open connection: it hangs. The heartbeat therefore notices a cut
store only once its beat is overdue (`CALL_FENCE` of the dead-after limit, openhub.store.workers), and a call
started meanwhile (a step whose lease was written just before the cut, a batch member) could not be recorded:
the lease runs out, another worker repairs the step and makes the call again. So a worker process sends an
external call only within `PROOF_AGE` of a successful round trip of its own to the store:

- every statement of the process that the store answers is a proof, as of when it was sent (a request that
  was answered left before any cut; its answer may be read later): openhub.store.db records it
  (`record_proofs`) on the steps' engine and on the heartbeat's own connection, at the cost of reading the
  clock twice per statement. Entering a step writes its lease, so a step that calls at once needs no more;
- older than that, the call waits for a ping (`SELECT 1`) on a connection of its own whose every wait, its
  opening included, has a deadline (libpq's non-blocking API): a cut link cannot hold it. The ping must be
  answered within `PROOF_AGE` of being sent; it failed or did not: the call is refused as the fence refuses
  it (Fenced: the step's lease is let go, the step runs later);
- one ping in flight per process: greenlets, or threads, wanting a proof meanwhile wait for its outcome.

The bound, `PROOF_AGE` = 0.5 s: a call is sent at most that long after the store last answered this process,
so after a cut a call may start only within it, as if it had been in flight when the cut came (the multi-host
checker counts it so, tests/support/history.py). It is a tenth of a second's ping on a box loaded at 10x its
cores with room to spare, a sixth of the rig's dead-after limit (3 s) and a thirtieth of the default (15 s):
well inside the time a call has before others may judge its process dead. Shorter makes more pings (a step
computing longer than it before its call pays one; a batch member under prefork reads its lease right before
its call, which is its proof) and refuses calls on a box whose store answers slowly.

SQLite is embedded: nothing can cut it, and no proof is asked.
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Any

from sqlalchemy.engine import make_url

from openhub.store.db import prove_at, proved_since

PROOF_AGE = 0.5  # seconds: a call is sent only this soon after a round trip of its process to the store
PING_CONNECT_TIMEOUT = 2.0  # seconds for the ping's connection to open (a new one after a failed ping)
_failed: dict[str, float] = {}  # database URL -> monotonic time this process's last ping failed
_pings: dict[str, _Ping] = {}  # database URL -> this process's ping connection
_inherited: list[_Ping] = []  # a parent's pings, in a forked child: kept from the garbage collector
_lock: tuple[int, Any] | None = None  # (pid, lock): one ping in flight per process
_made = 0  # pings sent by this process (a measure of their cost)


def proved(url: str) -> bool:
    """Whether this process may send an external call now: its store answered a statement sent no more than
    `PROOF_AGE` ago, or a ping does now (SQLite: always)."""
    if url.startswith("sqlite"):
        return True
    asked = time.monotonic()
    if asked - proved_since(url) <= PROOF_AGE:
        return True
    with _ping_lock():
        if time.monotonic() - proved_since(url) <= PROOF_AGE:  # a ping answered while this one waited
            return True
        if _failed.get(url, float("-inf")) >= asked:  # the ping it waited for failed: so would its own
            return False
        sent = _ping_of(url).ping(PROOF_AGE)
        if sent is None:
            _failed[url] = time.monotonic()
            return False
        prove_at(url, sent)
        return time.monotonic() - sent <= PROOF_AGE


def pings_made() -> int:
    """How many pings this process sent (bench: the proof's cost)."""
    return _made


def _ping_lock() -> Any:
    """The process's ping lock: under gevent a greenlet's (threading is patched by then), made anew in a
    forked child (its parent's may have been held at the fork)."""
    global _lock
    if _lock is None or _lock[0] != os.getpid():
        _lock = (os.getpid(), threading.Lock())
    return _lock[1]


def _ping_of(url: str) -> _Ping:
    ping = _pings.get(url)
    if ping is None or ping.pid != os.getpid():
        if ping is not None:  # a forked child's: its parent's is kept, never closed (it would end the parent's)
            _inherited.append(ping)
        ping = _pings[url] = _Ping(url)
    return ping


class _Ping:
    """A connection of its own for pings, through libpq's non-blocking API, each wait under a deadline:
    kept between pings, opened anew after one failed."""

    def __init__(self, url: str) -> None:
        from psycopg.conninfo import make_conninfo

        u = make_url(url)
        params = {"host": u.host, "port": u.port, "dbname": u.database, "user": u.username, "password": u.password}
        params.update({k: v for k, v in u.query.items() if isinstance(v, str)})
        self.conninfo = make_conninfo("", **{k: v for k, v in params.items() if v is not None})
        self.pid = os.getpid()
        self.pg: Any = None

    def ping(self, timeout: float) -> float | None:
        """Send `SELECT 1` and wait up to `timeout` for its answer: the monotonic time it was sent, or None
        (the store did not answer in time, or the connection failed; it is closed). A kept connection that
        failed at once (the server closed it meanwhile: a restart, an idle timeout) is tried once anew."""
        kept = self.pg is not None
        try:
            return self._once(timeout)
        except TimeoutError:
            return None
        except Exception:
            if not kept:
                return None
        try:
            return self._once(timeout)
        except Exception:
            return None

    def _once(self, timeout: float) -> float:
        global _made
        from psycopg import pq

        try:
            if self.pg is None:
                self.pg = self._connect(time.monotonic() + PING_CONNECT_TIMEOUT)
            pg = self.pg
            sent = time.monotonic()
            deadline = sent + timeout
            _made += 1
            pg.send_query(b"SELECT 1")
            while pg.flush():
                _wait(pg.socket, select.POLLOUT, deadline)
            ok = False
            while True:
                while pg.is_busy():
                    _wait(pg.socket, select.POLLIN, deadline)
                    pg.consume_input()
                result = pg.get_result()
                if result is None:
                    break
                ok = ok or result.status == pq.ExecStatus.TUPLES_OK
            if not ok:
                raise OSError("the ping was not answered with a row")
            return sent
        except Exception:
            self.close()
            raise

    def _connect(self, deadline: float) -> Any:
        from psycopg import pq

        pg = pq.PGconn.connect_start(self.conninfo.encode())
        if pg.status == pq.ConnStatus.BAD:
            raise OSError(pg.get_error_message())
        pg.nonblocking = 1
        while True:
            status = pg.connect_poll()
            if status == pq.PollingStatus.OK:
                return pg
            if status == pq.PollingStatus.FAILED:
                error = pg.get_error_message()
                pg.finish()
                raise OSError(error)
            try:
                _wait(pg.socket, select.POLLIN if status == pq.PollingStatus.READING else select.POLLOUT, deadline)
            except Exception:
                pg.finish()
                raise

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None and self.pid == os.getpid():
            try:
                pg.finish()
            except Exception:
                pass


def _wait(fd: int, events: int, deadline: float) -> None:
    """Wait until `fd` is ready for `events` (gevent's poll under gevent: other greenlets go on), or raise
    TimeoutError at `deadline`."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the store did not answer the ping in time")
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    if not poller.poll(left * 1000):
        raise TimeoutError("the store did not answer the ping in time")
