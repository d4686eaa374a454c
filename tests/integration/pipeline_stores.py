"""Generated message stores for the pipeline tests, and the report's figures recomputed in SQL.

`generate_store` writes a deterministic store through the real schema (Alembic `upgrade`):
every route, source system and state, Split families two levels deep (some with a child still
running under a final parent), retried and failed external calls, business errors,
confirmations still being retried, and entity-scope call records. `sql_report` is the oracle:
the same figures as `openhub.pipeline.report`, computed by the database itself.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from openhub.store import schema
from openhub.store.db import dispose_engines, get_engine, transaction
from openhub.store.migrate import upgrade

POSTGRES_ADMIN_URL = os.environ.get("OPENHUB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
NOW = datetime(2026, 11, 10, 12, 0, 0)
FINAL = ("OK", "FAILED", "CANCEL", "SKIPPED")
NON_FINAL = ("NEW", "IN_QUEUE", "PROCESSING", "WAITING", "WAITING_FOR_RES", "PARTLY_FAILED", "POSTPONED")
SOURCES = ("CRM", "ESHOP", "BILLING")
STEPS = {
    "customer.setCustomer": ("update_billing", "activate_sim"),
    "order.create": ("check_order", "split_lines", "notify_warehouse"),
    "order.bookLine": ("book_line",),
    "billing.invoice": ("issue_invoice", "send_pdf"),
}
ERROR_CODES = ("E410", "E422", "E500", "W100")
TABLES = ("messages", "ext_calls", "transitions", "confirmations", "http_exchanges", "waits")


@pytest.fixture(scope="session", name="spark")
def spark_fixture():  # type: ignore[no-untyped-def]
    """One SparkSession (local[2], both JDBC drivers) for every pipeline test: start-up is slow."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from openhub.pipeline.session import find_jdbc_jar, spark_session

    session = spark_session("local[2]", [find_jdbc_jar("postgresql"), find_jdbc_jar("sqlite")], "openhub tests")
    yield session
    session.stop()


@pytest.fixture(params=["sqlite", "postgresql"], name="backend_url")
def backend_url_fixture(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """An empty migrated store on each backend: a temp SQLite file, a fresh PostgreSQL database."""
    with store_url(request.param, str(tmp_path)) as url:
        yield url


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database with a random name; dropped afterwards. Yields its URL."""
    name = f"openhub_pipe_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def store_url(backend: str, directory: str) -> Iterator[str]:
    """An empty, migrated store on `backend` ("sqlite" in `directory`, or "postgresql")."""
    if backend == "sqlite":
        url = f"sqlite:///{directory}/store-{uuid.uuid4().hex[:8]}.db"
        upgrade(url)
        try:
            yield url
        finally:
            dispose_engines()
    else:
        with postgres_database() as url:
            upgrade(url)
            yield url


def _micro(rng: random.Random) -> timedelta:
    return timedelta(microseconds=rng.randrange(1_000_000))


class _Builder:
    def __init__(self, seed: int, now: datetime, archivable_only: bool) -> None:
        self.rng = random.Random(seed)
        self.now = now
        self.archivable_only = archivable_only
        self.rows: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
        self.ids = defaultdict(int)

    def next_id(self, table: str) -> int:
        self.ids[table] += 1
        return self.ids[table]

    def state(self) -> str:
        rng = self.rng
        if self.archivable_only or rng.random() < 0.8:
            return rng.choices(FINAL, weights=(70, 15, 8, 7))[0]
        return rng.choice(NON_FINAL)

    def message(self, route: str, parent: dict[str, Any] | None = None, state: str | None = None) -> dict[str, Any]:
        rng = self.rng
        service, operation = route.split(".")
        mid = self.next_id("messages")
        if parent is None:
            # Mostly days old; a tenth finished within the last hour (too young to archive at 1h).
            age = (
                timedelta(seconds=rng.uniform(3600, 4 * 86400))
                if rng.random() < 0.9
                else timedelta(seconds=rng.uniform(0, 1800))
            )
            received = self.now - age - _micro(rng)
        else:
            received = parent["received_at"] + timedelta(seconds=rng.uniform(0.01, 2)) + _micro(rng)
        state = state or self.state()
        final = state in FINAL
        finished = received + timedelta(seconds=rng.expovariate(1 / 40)) + _micro(rng) if final else None
        if finished is not None and finished > self.now:
            finished = self.now - _micro(rng)
        attempts = rng.choice((1, 1, 1, 2, 3))
        errors = None
        if rng.random() < 0.25:
            errors = json.dumps(
                [
                    {"code": rng.choice(ERROR_CODES), "text": "refused by the target"}
                    for _ in range(rng.choice((1, 1, 2)))
                ]
            )
        row = {
            "id": mid,
            "source_system": rng.choice(SOURCES),
            "correlation_id": f"c-{mid}",
            "process_id": None,
            "service": service,
            "operation": operation,
            "object_id": f"obj-{rng.randrange(400)}",
            "entity_type": operation,
            "funnel": None,
            "parent_id": parent["id"] if parent else None,
            "payload": json.dumps({"n": mid, "text": "é ✓"}),
            "state": state,
            "failed_count": attempts - 1 + (state == "FAILED"),
            "attempt_id": str(uuid.UUID(int=mid)),
            "step_run": None,
            "due_at": None if final else self.now + timedelta(minutes=5),
            "received_at": received,
            "msg_timestamp": received - timedelta(seconds=1),
            "started_at": received + timedelta(milliseconds=5),
            "updated_at": finished or received + timedelta(seconds=1),
            "finished_at": finished,
            "attempts": attempts,
            "generation": 0,
            "custom_data": json.dumps({"k": mid}) if mid % 3 == 0 else None,
            "business_errors": errors,
            "response": None,
            "failed_step": None,
            "failed_error": "Traceback: boom" if state == "FAILED" else None,
        }
        self.rows["messages"].append(row)
        self._calls(row, route)
        self._history(row)
        if mid % 5 == 0:  # a question asked and answered (chosen by id: the rest of the store is unchanged)
            self.rows["waits"].append(
                {
                    "id": self.next_id("waits"),
                    "token": f"{mid}.{mid:024x}",
                    "message_id": mid,
                    "step_key": "ask",
                    "asked_at": received,
                    "answer": '{"approved": true}',
                    "answered_at": received,
                    "answered_by": "BANK",
                }
            )
        return row

    def _calls(self, row: dict[str, Any], route: str) -> None:
        rng = self.rng
        for step in STEPS[route]:
            if rng.random() < 0.15:
                continue
            state = rng.choices(("OK", "FAILED", "PROCESSING"), weights=(80, 15, 5))[0]
            if row["state"] in FINAL and state == "PROCESSING":
                state = "OK"
            # A few calls are entity-scoped: one record per entity, shared by its messages.
            scope = "entity" if step == "activate_sim" and rng.random() < 0.3 else "message"
            key = f"{row['entity_type']}:{row['object_id']}:{step}" if scope == "entity" else f"{row['id']}:{step}"
            if scope == "entity" and any(c["key"] == key for c in self.rows["ext_calls"]):
                scope, key = "message", f"{row['id']}:{step}"
            self.rows["ext_calls"].append(
                {
                    "id": self.next_id("ext_calls"),
                    "key": key,
                    "message_id": row["id"],
                    "step_key": step,
                    "scope": scope,
                    "state": state,
                    "msg_timestamp": row["msg_timestamp"],
                    "attempts": rng.choice((1, 1, 2, 4)),
                    "created_at": row["received_at"],
                    "updated_at": row["updated_at"],
                    "duration_ms": rng.randrange(5, 3000) if state != "PROCESSING" else None,
                    "last_error": "HTTP 503" if state == "FAILED" else None,
                }
            )
            call_id = self.ids["ext_calls"]
            # Recorded by an HttpCall(record=True): archived with its message. Chosen by id, not by
            # `rng`, so the rest of the generated store is what it was before exchanges existed.
            if call_id % 3 == 0:
                self.rows["http_exchanges"].append(
                    {
                        "id": self.next_id("http_exchanges"),
                        "message_id": row["id"],
                        "step_key": step,
                        "attempt": 1,
                        "method": "POST",
                        "url": f"http://ext/{step}",
                        "status": 503 if state == "FAILED" else 200,
                        "error": None,
                        "request_headers": '{"Authorization": "[redacted]"}',
                        "request_body": '{"n": 1}',
                        "response_headers": "{}",
                        "response_body": "é ✓",
                        "duration_ms": (call_id * 37) % 900,
                        "at": row["received_at"] + timedelta(milliseconds=7),
                    }
                )

    def _history(self, row: dict[str, Any]) -> None:
        rng = self.rng
        at = row["received_at"]
        path = ["NEW", "IN_QUEUE", "PROCESSING"] + (["PARTLY_FAILED", "PROCESSING"] if row["attempts"] > 1 else [])
        path.append(row["state"])
        for before, after in zip([None] + path[:-1], path):
            at += timedelta(milliseconds=rng.randrange(1, 500))
            self.rows["transitions"].append(
                {
                    "id": self.next_id("transitions"),
                    "message_id": row["id"],
                    "at": at,
                    "event": "generated",
                    "from_state": before,
                    "to_state": after,
                    "step_key": None,
                    "detail": None,
                }
            )
        if row["state"] in ("OK", "FAILED", "CANCEL"):
            states = ("OK", "FAILED_END") if self.archivable_only else ("OK", "FAILED_END", "PENDING", "FAILED")
            state = rng.choices(states, weights=(80, 8, 6, 6)[: len(states)])[0]
            self.rows["confirmations"].append(
                {
                    "id": self.next_id("confirmations"),
                    "message_id": row["id"],
                    "outcome": row["state"],
                    "state": state,
                    "attempts": 1,
                    "due_at": None if state in ("OK", "FAILED_END") else self.now,
                    "created_at": row["finished_at"],
                    "updated_at": row["finished_at"],
                    "last_error": None,
                }
            )


def generate_store(
    url: str, roots: int = 200, seed: int = 5, now: datetime = NOW, archivable_only: bool = False
) -> dict[str, int]:
    """Fill the empty store at `url`; return the row count of each table.

    `archivable_only` makes every message final with a settled confirmation and no shared call
    records, so an archive with a zero age takes the whole store.
    """
    builder = _Builder(seed, now, archivable_only)
    rng = builder.rng
    for _ in range(roots):
        route = rng.choice(tuple(STEPS))
        parent = builder.message(route)
        if route == "order.create" and rng.random() < 0.6:
            for _ in range(rng.randint(1, 3)):
                child = builder.message("order.bookLine", parent)
                if rng.random() < 0.3:
                    builder.message("billing.invoice", child)
    if archivable_only:
        for call in builder.rows["ext_calls"]:
            call["scope"], call["key"] = "message", f"{call['message_id']}:{call['step_key']}"
    with transaction(url) as conn:
        for table in TABLES:
            if builder.rows[table]:
                conn.execute(getattr(schema, table).insert(), builder.rows[table])
    return {t: len(builder.rows[t]) for t in TABLES}


def snapshot(url: str) -> dict[str, dict[int, dict[str, Any]]]:
    """Every row of the archived tables, by table and id, as Python values."""
    result = {}
    with get_engine(url).connect() as conn:
        for table in TABLES:
            t = getattr(schema, table)
            result[table] = {row.id: dict(row._mapping) for row in conn.execute(select(t))}
    return result


# --- the oracle: the report's figures computed by the database --------------------------------


def _range_sql(start: datetime | None, end: datetime | None, column: str = "received_at") -> tuple[str, dict]:
    parts, params = [], {}
    if start:
        parts.append(f"{column} >= :start")
        params["start"] = start
    if end:
        parts.append(f"{column} < :end")
        params["end"] = end
    return (" AND ".join(parts) or "1 = 1"), params


def percentile_cont(values: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def sql_report(url: str, start: datetime | None = None, end: datetime | None = None) -> dict[str, list[dict]]:
    """The report's tables computed in SQL (see openhub.pipeline.report for the definitions)."""
    where, params = _range_sql(start, end)
    postgres = url.startswith("postgresql")
    final = "('OK', 'FAILED', 'CANCEL', 'SKIPPED')"
    route = "service || '.' || operation"
    if postgres:
        seconds = "EXTRACT(EPOCH FROM finished_at - received_at)"
        hour = "to_char(date_trunc('hour', {c}), 'YYYY-MM-DD HH24:00')"
        codes = (
            "SELECT e->>'code' AS code, m.id FROM messages m, jsonb_array_elements(m.business_errors::jsonb) e "
            f"WHERE m.business_errors IS NOT NULL AND {where}"
        )
    else:
        # Whole seconds from strftime plus the stored fraction: exact, where julianday() loses ~0.1 ms.
        seconds = (
            "(strftime('%s', finished_at) - strftime('%s', received_at)) + "
            "(CAST(substr(finished_at, 20) AS REAL) - CAST(substr(received_at, 20) AS REAL))"
        )
        hour = "strftime('%Y-%m-%d %H:00', {c})"
        codes = (
            "SELECT json_extract(e.value, '$.code') AS code, m.id FROM messages m, json_each(m.business_errors) e "
            f"WHERE m.business_errors IS NOT NULL AND {where}"
        )
    out: dict[str, list[dict]] = {}
    with get_engine(url).connect() as conn:

        def rows(sql: str) -> list[dict]:
            return [dict(r._mapping) for r in conn.execute(text(sql), params)]

        out["counts"] = rows(
            f"SELECT source_system, {route} AS route, state, count(*) AS messages FROM messages "
            f"WHERE {where} GROUP BY source_system, {route}, state"
        )
        rates = rows(
            f"SELECT {route} AS route, count(*) AS messages, "
            f"sum(CASE WHEN state IN {final} THEN 1 ELSE 0 END) AS finished, "
            f"sum(CASE WHEN state = 'FAILED' THEN 1 ELSE 0 END) AS failed, "
            f"sum(CASE WHEN attempts > 1 THEN 1 ELSE 0 END) AS retried "
            f"FROM messages WHERE {where} GROUP BY {route}"
        )
        for r in rates:
            r["failure_rate"] = r["failed"] / r["finished"] if r["finished"] else None
            r["retry_rate"] = r["retried"] / r["messages"]
        out["route_rates"] = rates
        if postgres:
            pct = (
                "percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS p50_s, "
                "percentile_cont(0.95) WITHIN GROUP (ORDER BY d) AS p95_s, "
                "percentile_cont(0.99) WITHIN GROUP (ORDER BY d) AS p99_s, max(d) AS max_s, count(*) AS finished"
            )
            inner = f"SELECT {route} AS route, {seconds} AS d FROM messages WHERE state IN {final} AND {where}"
            times = rows(f"SELECT route, {pct} FROM ({inner}) t GROUP BY route")
            times += [dict(r, route="*") for r in rows(f"SELECT {pct} FROM ({inner}) t HAVING count(*) > 0")]
        else:  # SQLite has no percentile_cont: the database computes durations, Python interpolates.
            durations: dict[str, list[float]] = defaultdict(list)
            for r in rows(f"SELECT {route} AS route, {seconds} AS d FROM messages WHERE state IN {final} AND {where}"):
                durations[r["route"]].append(r["d"])
                durations["*"].append(r["d"])
            times = [
                {
                    "route": k,
                    "finished": len(v),
                    "p50_s": percentile_cont(v, 0.5),
                    "p95_s": percentile_cont(v, 0.95),
                    "p99_s": percentile_cont(v, 0.99),
                    "max_s": max(v),
                }
                for k, v in durations.items()
            ]
        out["processing_time"] = [{k: float(v) if k.endswith("_s") else v for k, v in r.items()} for r in times]
        received = {
            r["hour"]: r["n"]
            for r in rows(
                f"SELECT {hour.format(c='received_at')} AS hour, count(*) AS n FROM messages WHERE {where} GROUP BY 1"
            )
        }
        finished = {
            r["hour"]: r["n"]
            for r in rows(
                f"SELECT {hour.format(c='finished_at')} AS hour, count(*) AS n FROM messages "
                f"WHERE finished_at IS NOT NULL AND {where} GROUP BY 1"
            )
        }
        out["throughput_hourly"] = [
            {"hour": h, "received": received.get(h, 0), "finished": finished.get(h, 0)}
            for h in sorted(set(received) | set(finished))
        ]
        calls = rows(
            f"SELECT {route} AS route, c.step_key, count(*) AS calls, "
            "sum(CASE WHEN c.state = 'FAILED' THEN 1 ELSE 0 END) AS failed, sum(c.attempts) AS attempts, "
            "avg(c.duration_ms) AS avg_duration_ms "
            f"FROM ext_calls c JOIN messages m ON m.id = c.message_id WHERE {where} "
            f"GROUP BY {route}, c.step_key"
        )
        for r in calls:
            r["failure_rate"] = r["failed"] / r["calls"]
            r["avg_duration_ms"] = float(r["avg_duration_ms"]) if r["avg_duration_ms"] is not None else None
        out["ext_call_failures"] = calls
        exchanges = rows(
            f"SELECT {route} AS route, x.step_key, x.status, count(*) AS exchanges, "
            "avg(x.duration_ms) AS avg_duration_ms, max(x.duration_ms) AS max_duration_ms "
            f"FROM http_exchanges x JOIN messages m ON m.id = x.message_id WHERE {where} "
            f"GROUP BY {route}, x.step_key, x.status"
        )
        for r in exchanges:
            r["avg_duration_ms"] = float(r["avg_duration_ms"])
        out["http_statuses"] = exchanges
        out["business_errors"] = rows(
            f"SELECT code, count(*) AS occurrences, count(DISTINCT id) AS messages "
            f"FROM ({codes}) e WHERE code IS NOT NULL GROUP BY code"
        )
    per_route = [r for r in out["processing_time"] if r["route"] != "*"]
    out["slowest_routes"] = sorted(per_route, key=lambda r: (-r["p95_s"], r["route"]))[:10]
    return out


def archive_midway(out: Path, url: str, stored: int, published: int = 1) -> bool:
    """Whether an `archive` run writing to `out` is midway: `published` batches written and deleted from the
    store at `url` (fewer than `stored` messages left) and the next one being written. (Written batches and
    a staged one alone did not say a delete had committed: killed then, the store still held all 143
    messages, in a CI run on a loaded box.)"""
    done = list((out / "_batches").glob("*.json")) if (out / "_batches").exists() else []
    staged = list((out / "_staging").glob("*/*")) if (out / "_staging").exists() else []
    if len(done) < published or not staged:
        return False
    with get_engine(url).connect() as conn:
        return bool(conn.execute(select(func.count()).select_from(schema.messages)).scalar_one() < stored)


def wait_while_running(condition: Callable[[], bool], process: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll `condition` until it holds; fail if `process` (whose output is `log`) ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(
                f"the run ended (rc {process.returncode}) before it could be killed:\n{log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"the run made no progress in {timeout}s:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)  # polling interval of the condition check, not a synchronisation delay
