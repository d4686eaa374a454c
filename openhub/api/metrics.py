"""GET /metrics: Prometheus metrics, named exactly as `deploy/metrics.txt` promises.

Two kinds of series:

- counted in this process: `openhub_http_requests_total{method,route,status}` and
  `openhub_messages_accepted_total{route,source_system}` (with several uvicorn workers,
  `openhub serve` sets PROMETHEUS_MULTIPROC_DIR so the workers' counts are added up);
- read from the message store when Prometheus scrapes (`StoreCollector`), because the
  workers that do the work export nothing themselves:
  * `openhub_messages{route,state}` and `openhub_oldest_message_age_seconds{route}`: one
    GROUP BY over non-final rows only (the state index and the partial index over non-final
    rows keep it independent of how many OK/FAILED messages the table holds). Final states are
    not counted here; how many messages finish is `openhub_messages_finished_total`.
  * `openhub_confirmations{state}`: confirmations not (yet) OK, by state.
  * `openhub_messages_finished_total{route,state}` and `openhub_ext_call_failures_total{route,step}`:
    entries of the transition history (final states; `transient` step failures), read
    incrementally by id (a primary-key range per scrape, re-reading the last 1000 ids for rows
    committed out of order). The history is append-only, so no event is missed between scrapes.
    They count from the moment this app first served /metrics, like any counter (with
    several uvicorn workers: from the first worker's first scrape, so all workers agree).
  * `openhub_step_duration_seconds{route,step}`: `duration_ms` of external-call records that
    turned OK since the previous scrape (by `updated_at`, once per call and attempt). Only
    successful attempts: a failed attempt's duration is overwritten by its retry, so it cannot
    be observed reliably. `ext_calls.updated_at` has no index; on a big table this is a scan
    per scrape (an index on it would make it a range read).
  Every ingress process computes the database series from the same tables, so across replicas
  take `max`, not `sum`, of them. They are read at most once per OPENHUB_METRICS_CACHE seconds
  (default 5) per process: each read is several queries, whoever holds the token and however often.
  They are read from the store of the hub the app serves, with its routes, its clock and its cache
  period (each app its own `StoreCollector`, `openhub.api.app.create_app`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import and_, func, or_, select

from openhub.core.model import route_name
from openhub.core.states import FINAL, NON_FINAL, CallState, ConfirmationState, Event
from openhub.engine.hub import Hub
from openhub.store.schema import confirmations, ext_calls, messages, transitions

log = logging.getLogger("openhub.api.metrics")
disable_created_metrics()  # the _created series double the output and no dashboard reads them

HTTP_REQUESTS = Counter("openhub_http_requests", "HTTP requests served by the ingress.", ["method", "route", "status"])
ACCEPTED = Counter(
    "openhub_messages_accepted", "Messages accepted (stored) through the HTTP ingress.", ["route", "source_system"]
)

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
CONFIRMATION_STATES = tuple(s for s in ConfirmationState if s != ConfirmationState.OK)
TRANSITION_LAG = 1000  # ids re-read each scrape: history rows committed out of id order are still counted
CALL_LAG = timedelta(seconds=10)  # likewise for ext-call rows committed after the scrape's clock


def accepted(route: str, source_system: str) -> None:
    """Count one accepted message."""
    ACCEPTED.labels(route=route, source_system=source_system).inc()


def http_request(method: str, route: str, status: int) -> None:
    """Count one served request."""
    HTTP_REQUESTS.labels(method=method, route=route, status=str(status)).inc()


class StoreCollector:
    """Series read from `hub`'s message store at scrape time (see the module docstring)."""

    def __init__(self, hub: Hub, clock: Callable[[], float] = time.monotonic, ttl: float | None = None) -> None:
        self.hub = hub
        self._lock = threading.Lock()
        self._clock = clock
        self._ttl = ttl  # None: OPENHUB_METRICS_CACHE
        self._cached: tuple[float, list[Metric]] | None = None
        self._reset()

    def _reset(self) -> None:
        self._transition_mark: int | None = None
        self._transition_born = 0
        self._seen_transitions: set[int] = set()
        self._finished: dict[tuple[str, str], int] = defaultdict(int)
        self._call_mark: datetime | None = None
        self._call_born = datetime.min
        self._seen_calls: dict[tuple[int, int, str], object] = {}
        self._buckets: dict[tuple[str, str], list[int]] = {}
        self._duration_sum: dict[tuple[str, str], float] = defaultdict(float)
        self._failures: dict[tuple[str, str], int] = defaultdict(int)

    def describe(self) -> Iterator[Metric]:
        """Nothing at registration time: collecting queries the database."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """Every database-derived family: queried at most once per OPENHUB_METRICS_CACHE seconds.

        Without the cache each request would cost several queries on the message store, so a
        scraper polling it in a loop (or several Prometheus replicas) would load the database.
        """
        with self._lock:
            ttl = self._ttl if self._ttl is not None else self.hub.settings.metrics_cache.total_seconds()
            now = self._clock()
            if self._cached is None or now - self._cached[0] >= ttl:
                self._cached = (now, self._query(self.hub.settings.database_url))
            yield from self._cached[1]

    def _query(self, database: str) -> list[Metric]:
        routes = sorted(self.hub.registry.routes)
        gauges: list[Metric] = []
        try:
            with self.hub.transaction() as conn:
                gauges = self._gauges(conn, routes)
                if self._transition_mark is None:
                    self._start(conn, database)
                self._tail_transitions(conn)
                self._tail_calls(conn)
        except Exception as exc:
            log.warning("metrics: message store not readable: %s", type(exc).__name__)
        return [*gauges, *self._counters(routes)]

    # --- gauges: current non-final rows -------------------------------------------------------
    def _gauges(self, conn, routes: list[str]) -> list[Metric]:
        M = messages.c
        now = self.hub.clock()
        by_state = GaugeMetricFamily(
            "openhub_messages", "Messages in each non-final state, by route.", labels=["route", "state"]
        )
        oldest = GaugeMetricFamily(
            "openhub_oldest_message_age_seconds",
            "Age of the oldest non-final message of each route (0 when none).",
            labels=["route"],
        )
        counts: dict[tuple[str, str], int] = {(r, s.value): 0 for r in routes for s in NON_FINAL}
        first: dict[str, object] = {}
        query = (
            select(M.service, M.operation, M.state, func.count(), func.min(M.received_at))
            .where(M.state.in_([s.value for s in NON_FINAL]))
            .group_by(M.service, M.operation, M.state)
        )
        for service, operation, state, n, received in conn.execute(query):
            route = route_name(service, operation)
            counts[(route, state)] = n
            if received is not None and (route not in first or received < first[route]):
                first[route] = received
        for (route, state), n in sorted(counts.items()):
            by_state.add_metric([route, state], n)
        for route in sorted(set(routes) | set(first)):
            received = first.get(route)
            oldest.add_metric([route], max(0.0, (now - received).total_seconds()) if received else 0.0)
        C = confirmations.c
        pending = GaugeMetricFamily(
            "openhub_confirmations", "Confirmations not (yet) delivered, by state.", labels=["state"]
        )
        found = dict(
            conn.execute(select(C.state, func.count()).where(C.state.in_(CONFIRMATION_STATES)).group_by(C.state)).all()
        )
        for state in CONFIRMATION_STATES:
            pending.add_metric([state], found.get(state, 0))
        return [by_state, oldest, pending]

    # --- counters: tails of append-only history and of finished ext calls ----------------------
    def _start(self, conn, database: str) -> None:
        """First scrape: the counters count from now on (or from when a sibling worker's started)."""
        mark = conn.execute(select(func.max(transitions.c.id))).scalar() or 0
        born_transition, born_call = shared_start(database, mark, self.hub.clock())
        self._transition_mark = self._transition_born = born_transition
        self._call_mark = self._call_born = born_call

    def _tail_transitions(self, conn) -> None:
        T, M = transitions.c, messages.c
        mark = conn.execute(select(func.max(T.id))).scalar() or 0
        assert self._transition_mark is not None
        low = max(self._transition_born, self._transition_mark - TRANSITION_LAG)
        query = (
            select(T.id, M.service, M.operation, T.to_state, T.event, T.step_key)
            .join(messages, M.id == T.message_id)
            .where(
                and_(
                    T.id > low,
                    T.id <= mark,
                    or_(T.to_state.in_([s.value for s in FINAL]), T.event == Event.TRANSIENT.value),
                )
            )
        )
        for tid, service, operation, state, event, step_key in conn.execute(query):
            if tid in self._seen_transitions:
                continue
            self._seen_transitions.add(tid)
            route = route_name(service, operation)
            if state in FINAL:
                self._finished[(route, state)] += 1
            if event == Event.TRANSIENT.value and step_key:
                self._failures[(route, step_key)] += 1
        self._transition_mark = mark
        self._seen_transitions = {t for t in self._seen_transitions if t > mark - TRANSITION_LAG}

    def _tail_calls(self, conn) -> None:
        X, M = ext_calls.c, messages.c
        now = self.hub.clock()
        assert self._call_mark is not None
        since = max(self._call_born, self._call_mark - CALL_LAG)
        query = (
            select(X.id, X.attempts, X.state, X.duration_ms, X.step_key, X.updated_at, M.service, M.operation)
            .join(messages, M.id == X.message_id)
            .where(and_(X.updated_at > since, X.state == CallState.OK))
        )
        for cid, attempts, state, duration_ms, step_key, updated_at, service, operation in conn.execute(query):
            key = (cid, attempts, state)
            if key in self._seen_calls:
                continue
            self._seen_calls[key] = updated_at
            label = (route_name(service, operation), step_key)
            if duration_ms is not None:
                seconds = duration_ms / 1000
                buckets = self._buckets.setdefault(label, [0] * len(BUCKETS))
                for i, bound in enumerate(BUCKETS):
                    if seconds <= bound:
                        buckets[i] += 1
                self._duration_sum[label] += seconds
        self._call_mark = now
        self._seen_calls = {k: v for k, v in self._seen_calls.items() if v > now - 2 * CALL_LAG}

    def _counters(self, routes: list[str]) -> list[Metric]:
        finished = CounterMetricFamily(
            "openhub_messages_finished", "Messages that reached a final state, by route.", labels=["route", "state"]
        )
        keys = {(r, s.value) for r in routes for s in FINAL} | set(self._finished)
        for route, state in sorted(keys):
            finished.add_metric([route, state], self._finished.get((route, state), 0))
        duration = HistogramMetricFamily(
            "openhub_step_duration_seconds", "Duration of successful external-call steps.", labels=["route", "step"]
        )
        failures = CounterMetricFamily(
            "openhub_ext_call_failures", "Transient failures of steps (each is retried).", labels=["route", "step"]
        )
        for label in sorted(self._buckets):
            buckets = self._buckets[label]
            bounds = ["+Inf" if b == float("inf") else repr(b) for b in BUCKETS]
            duration.add_metric(list(label), list(zip(bounds, buckets)), self._duration_sum[label])
        for label in sorted(set(self._failures) | set(self._buckets)):
            failures.add_metric(list(label), self._failures.get(label, 0))
        return [finished, duration, failures]


def shared_start(database: str, transition: int, call: datetime) -> tuple[int, datetime]:
    """The marks the database-derived counters count from, shared by the workers of one `openhub serve`.

    With several uvicorn workers a scrape lands on any of them; counting from one common start
    (the first worker's, kept in the multiprocess directory) makes them all report the same
    values instead of values that jump between workers.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return transition, call
    key = hashlib.sha256(database.encode()).hexdigest()  # the URL may hold a password
    path = Path(directory) / "openhub-store-start.json"
    mine = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        mine.write_text(json.dumps({"database": key, "transitions": transition, "calls": call.isoformat()}))
        try:
            os.link(mine, path)  # atomic: the first worker's marks win
        except FileExistsError:
            pass
        finally:
            mine.unlink(missing_ok=True)
        shared = json.loads(path.read_text())
        if shared["database"] == key:
            return int(shared["transitions"]), datetime.fromisoformat(shared["calls"])
    except (OSError, ValueError, KeyError) as exc:
        log.warning("metrics: cannot share the counters' start between workers: %s", exc)
    return transition, call


def render(store: StoreCollector) -> tuple[bytes, str]:
    """The exposition text of every openhub metric: this process's counters (added up over uvicorn workers
    when multiprocess) and the series `store` reads from its hub's store."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(store)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    served = CollectorRegistry(auto_describe=False)
    served.register(store)
    return generate_latest(REGISTRY) + generate_latest(served), CONTENT_TYPE_LATEST
