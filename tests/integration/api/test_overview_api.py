"""GET /api/v1/overview and /api/v1/workers: admin only, the known traffic's figures, workers degrade."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openhub.store.db import utcnow
from tests.integration.api.conftest import ADMIN, CRM, make_client
from tests.support.traffic import EXPECTED, fresh_store, write_known_traffic


@pytest.fixture
def store(tmp_path) -> Iterator[str]:
    with fresh_store("sqlite", tmp_path) as url:
        yield url


def test_overview_needs_the_admin_token_and_reports_the_known_traffic(store: str) -> None:
    ids = write_known_traffic(utcnow())
    with make_client() as client:
        assert client.get("/api/v1/overview").status_code == 401
        assert client.get("/api/v1/overview", headers=CRM).status_code == 403
        r = client.get("/api/v1/overview", headers=ADMIN)
    assert r.status_code == 200
    body = r.json()
    assert body["live_by_state"] == EXPECTED["live"]
    assert body["finished"]["hour_total"]["finished"] == EXPECTED["hour_finished"]
    assert body["confirmations"]["parked_count"] == EXPECTED["parked"]
    oldest = {(x["route"], x["state"]): x["oldest_id"] for x in body["routes"] if not x["final"]}
    assert oldest[("customer.setCustomer", "PARTLY_FAILED")] == ids["oldest_partly_failed"]


def test_message_detail_lists_recorded_exchanges(store: str) -> None:
    ids = write_known_traffic(utcnow())
    with make_client() as client:
        detail = client.get(f"/api/v1/messages/{ids['oldest_partly_failed']}", headers=ADMIN).json()
    [x] = detail["http_exchanges"]
    assert (x["step"], x["status"], x["request_headers"]["authorization"]) == ("update_billing", 503, "[redacted]")


def test_workers_endpoint_answers_even_without_a_broker(store: str, monkeypatch) -> None:
    from openhub.celery import dispatch
    from openhub.core.config import reset_settings

    monkeypatch.setenv("OPENHUB_BROKER_URL", "redis://127.0.0.1:9/0")
    reset_settings()
    dispatch.reset_app()
    try:
        with make_client() as client:
            r = client.get("/api/v1/workers", headers=ADMIN)
        body = r.json()
        assert r.status_code == 200 and (body["available"], body["workers"]) == (False, [])
        assert isinstance(body["states"], list) and isinstance(body["held_hosts"], list)  # from the store
    finally:
        dispatch.reset_app()
        reset_settings()
