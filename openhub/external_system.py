"""`ExternalSystem`: a real HTTP external system with counters and failure injection, for tests (importable
from `openhub.testing`, beside `LocalHub`).

`ExternalSystem` is what `openhub dev` serves as the example routes' billing, network operator
and CRM, and what openhub's own tests (and users' tests of their routes) call from workers:

    system = ExternalSystem().start()
    system.fail("/billing/customers", times=2)        # the next two calls answer 503
    ...
    assert system.effects("/billing/customers") == 1  # applied once, however often it was called

A request with an `Idempotency-Key` already applied is answered like the first one and not
applied again, as a well-behaved external API does.

What it answers: any POST to any path, 200 with `{"id": "<path with / as ->-<n>"}` (`n` counts the calls
applied so far, so `r.json()["id"]` is a new id per applied call and the same one for a replay); an
injected failure (`fail`, `failure_rate`) answers its status with `{"error": "injected failure"}` and
applies nothing; `GET` any path answers the counters of `stats()`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Call:
    """One request the external system received."""

    path: str
    key: str | None
    body: Any
    status: int
    started: float
    ended: float
    replay: bool
    headers: dict[str, str] = field(default_factory=dict)  # as received (names lower-cased): traceparent...
    peer: str | None = None  # the caller's address (which host, where the test made several)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of calls may connect at once (a gevent worker's); the default is 5


class ExternalSystem:
    """A threaded HTTP server on 127.0.0.1 that records every call and fails on demand (its answers: the
    module's docstring)."""

    def __init__(self, failure_rate: float = 0.0, seed: int | None = None) -> None:
        self.failure_rate = failure_rate
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._failures: dict[str, list[int]] = defaultdict(list)
        self._delays: dict[str, float] = {}
        self._applied: dict[tuple[str, str], dict] = {}
        self._active: dict[str, int] = defaultdict(int)
        self._on_path: dict[str, int] = defaultdict(int)  # calls being answered now, per path
        self._gathers: dict[str, tuple[int, float, threading.Event]] = {}
        self.overlaps: list[str] = []
        self.in_flight = 0  # calls being answered now
        self.peak_in_flight = 0  # the most calls that were being answered at one moment
        self._random = random.Random(seed)
        self._server: ThreadingHTTPServer | None = None
        self.started_events: dict[str, threading.Event] = defaultdict(threading.Event)
        self.started: list[tuple[str, dict[str, str]]] = []  # (path, headers) of every call, as it begins

    # --- control -----------------------------------------------------------------------------
    def start(self, port: int = 0, host: str = "127.0.0.1") -> "ExternalSystem":
        """Serve in a daemon thread; `port=0` picks a free port (see `url`)."""
        system = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                status, answer = system._handle(
                    self.path,
                    self.headers.get("Idempotency-Key"),
                    self.headers.get("X-Funnel"),
                    body,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.client_address[0],
                )
                data = json.dumps(answer).encode()
                self._answer(status, data)

            def do_GET(self) -> None:
                self._answer(200, json.dumps(system.stats()).encode())

            def _answer(self, status: int, data: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except ConnectionError:
                    pass  # the caller gave up waiting (a step timeout): nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _Server((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, name="external-system", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123."""
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail(self, path: str, times: int = 1, status: int = 503) -> None:
        """The next `times` calls to `path` answer `status` and have no effect."""
        with self._lock:
            self._failures[path].extend([status] * times)

    def gather(self, path: str, calls: int, timeout: float) -> None:
        """Calls to `path` wait until `calls` of them are being answered at once (each at most `timeout`
        seconds), then all go on; later calls are not held. A test sees a caller keep that many calls in
        flight as a condition with a deadline, not as a peak that depends on how busy the machine is."""
        with self._lock:
            self._gathers[path] = (calls, timeout, threading.Event())

    def hold(self, path: str, timeout: float = 60.0) -> threading.Event:
        """Calls to `path` wait until the event returned is set (each at most `timeout` seconds): a call
        kept in flight until the test has done what it does meanwhile."""
        release = threading.Event()
        with self._lock:
            self._gathers[path] = (1 << 30, timeout, release)
        return release

    def delay(self, path: str, seconds: float) -> None:
        """Calls to `path` take `seconds` before they are applied (0 to stop delaying)."""
        with self._lock:
            self._delays[path] = seconds

    # --- observations ------------------------------------------------------------------------
    def effects(self, path: str | None = None) -> int:
        """How many distinct (path, idempotency key) calls were applied."""
        with self._lock:
            return sum(1 for (p, _k) in self._applied if path is None or p == path)

    def applied_keys(self, path: str) -> set[str]:
        """The idempotency keys applied on `path`."""
        with self._lock:
            return {k for (p, k) in self._applied if p == path}

    def count(self, path: str | None = None, status: int | None = None) -> int:
        """How many calls arrived (to `path`, with `status`)."""
        with self._lock:
            return sum(
                1 for c in self.calls if (path is None or c.path == path) and (status is None or c.status == status)
            )

    def stats(self) -> dict[str, Any]:
        """Counters per path, as GET / answers them."""
        with self._lock:
            out: dict[str, Any] = {}
            for c in self.calls:
                s = out.setdefault(c.path, {"calls": 0, "ok": 0, "failed": 0, "replays": 0})
                s["calls"] += 1
                s["ok" if c.status < 400 else "failed"] += 1
                s["replays"] += c.replay
            return out

    # --- the server's side -------------------------------------------------------------------
    def _handle(
        self,
        path: str,
        key: str | None,
        funnel: str | None,
        body: Any,
        headers: dict[str, str] | None = None,
        peer: str | None = None,
    ) -> tuple[int, Any]:
        started = time.monotonic()
        with self._lock:
            self.started_events[path].set()
            self.started.append((path, headers or {}))
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self._on_path[path] += 1
            gather = self._gathers.get(path)
            if gather is not None and self._on_path[path] >= gather[0]:
                gather[2].set()
            delay = self._delays.get(path, 0.0)
            planned = self._failures[path].pop(0) if self._failures[path] else None
            if funnel is not None:
                self._active[funnel] += 1
                if self._active[funnel] > 1:
                    self.overlaps.append(funnel)
        try:
            if gather is not None:
                gather[2].wait(gather[1])  # held until enough calls meet: the behaviour asked for, not a sync
            if delay:
                time.sleep(delay)  # the simulated system is slow; this is its behaviour, not a sync
            with self._lock:
                status, replay = 200, False
                if planned is not None:
                    status = planned
                elif self.failure_rate and self._random.random() < self.failure_rate:
                    status = 503
                answer: Any = {"error": "injected failure"} if status >= 400 else None
                if status < 400:
                    if key is not None and (path, key) in self._applied:
                        answer, replay = self._applied[(path, key)], True
                    else:
                        answer = {"id": f"{path.strip('/').replace('/', '-')}-{len(self._applied) + 1}"}
                        self._applied[(path, key or f"anonymous-{len(self.calls)}")] = answer
                self.calls.append(Call(path, key, body, status, started, time.monotonic(), replay, headers or {}, peer))
                return status, answer
        finally:
            with self._lock:
                self.in_flight -= 1
                self._on_path[path] -= 1
                if funnel is not None:
                    self._active[funnel] -= 1
