"""/metrics exports every name deploy/metrics.txt promises, with values read from the store."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import openhub
from openhub.testing import ExternalSystem
from tests.integration.api.conftest import ADMIN, CRM, METRICS, SHOP, bearer, make_client
from tests.support.waiting import wait_final, wait_for

PROMISED = Path(__file__).resolve().parents[3] / "deploy" / "metrics.txt"


def promised_names() -> set[str]:
    names = set()
    for line in PROMISED.read_text().splitlines():
        if line.strip() == "# flower":
            break
        if line.strip() and not line.startswith("#"):
            names.add(line.strip())
    return names


def exported(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_exports_every_promised_name(client, cid, flow_payload):
    client.post("/api/v1/messages/test/flow", json=flow_payload, headers={**CRM, "X-Correlation-Id": cid})
    r = client.get("/metrics", headers=METRICS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert promised_names() and promised_names() <= exported(r.text), promised_names() - exported(r.text)
    assert sample(r.text, "openhub_messages_accepted_total", route="test.flow", source_system="CRM") >= 1
    assert sample(r.text, "openhub_http_requests_total", status="202") >= 1
    # The store is shared by the session's tests: the gauge must equal what is parked in it.
    parked = len(openhub.list_confirmations(state="FAILED_END", limit=100_000))
    assert sample(r.text, "openhub_confirmations", state="FAILED_END") == parked


def test_database_series_follow_the_work_of_workers(api_env, hub, external: ExternalSystem, prefix):
    with make_client() as client:
        before = client.get("/metrics", headers=METRICS).text  # the first scrape starts the database-derived counters
        external.fail(f"{prefix}/b", times=1)
        r = client.post(
            "/api/v1/messages/test/flow", json={"prefix": prefix}, headers={**CRM, "X-Correlation-Id": uuid.uuid4().hex}
        )
        assert r.status_code == 202
        assert wait_final(r.json()["id"]).state == "OK"

        def scraped() -> str | None:
            text = client.get("/metrics", headers=METRICS).text
            done = sample(text, "openhub_messages_finished_total", route="test.flow", state="OK")
            return (
                text
                if done > sample(before, "openhub_messages_finished_total", route="test.flow", state="OK")
                else None
            )

        text = wait_for(scraped, 20, "the finished counter to count the message")
        assert sample(text, "openhub_step_duration_seconds_count", route="test.flow", step="c") >= 1
        assert sample(text, "openhub_step_duration_seconds_count", route="test.flow", step="b") >= 1
        assert sample(text, "openhub_ext_call_failures_total", route="test.flow", step="b") >= 1
        assert sample(text, "openhub_messages", route="test.flow", state="PROCESSING") >= 0


def test_database_series_are_read_at_most_once_per_cache_period(api_env):
    from sqlalchemy import event

    from openhub.api.metrics import StoreCollector
    from openhub.core.config import get_settings
    from openhub.engine.hub import current
    from openhub.store.db import get_engine

    statements: list[str] = []
    engine = get_engine(get_settings().database_url)

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    now = [1000.0]
    collector = StoreCollector(current(), clock=lambda: now[0], ttl=5)
    event.listen(engine, "before_cursor_execute", count)
    try:
        first = list(collector.collect())
        assert statements, "the first scrape reads the store"
        statements.clear()
        now[0] += 4.9
        assert list(collector.collect()) == first and statements == []  # from the cache: no query at all
        now[0] += 0.2
        list(collector.collect())
        assert statements, "once the period is over the store is read again"
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_metrics_need_the_metrics_or_the_admin_token(client):
    # Issue 27: /metrics answered anyone who reached the port, naming every route, step and source system.
    for headers in ({}, bearer("not-a-token")):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and set(r.json()) == {"status", "detail"}
        assert "openhub_" not in r.text
    for key in (CRM, SHOP):  # a source system's key is valid, but not for this
        r = client.get("/metrics", headers=key)
        assert r.status_code == 403
        assert r.json() == {
            "status": 403,
            "detail": "/metrics needs the metrics token (OPENHUB_METRICS_TOKEN) or an operator token",
        }
    for headers in (METRICS, ADMIN):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 200 and "# TYPE openhub_messages gauge" in r.text


def test_the_metrics_token_opens_nothing_else(client):
    for method, path in [
        ("GET", "/api/v1/messages"),
        ("GET", "/api/v1/overview"),
        ("GET", "/api/v1/routes"),
        ("POST", "/api/v1/messages:restart"),
    ]:
        assert client.request(method, path, headers=METRICS).status_code == 401, path
