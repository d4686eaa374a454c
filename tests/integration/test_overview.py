"""openhub.service.overview on both databases: the figures of a store with known traffic (tests/support/traffic.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openhub.core.config import reset_settings
from openhub.service.overview import overview, workers
from openhub.store.db import utcnow
from tests.support.traffic import EXPECTED, fresh_store, write_known_traffic
from tests.support.waiting import wait_for


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    with fresh_store(request.param, tmp_path) as url:
        yield url


def test_overview_of_known_traffic(store: str) -> None:
    now = utcnow()
    ids = write_known_traffic(now)
    o = overview(now)
    counts = {(r["route"], r["state"]): r["count"] for r in o["routes"]}
    assert counts == EXPECTED["counts"]
    assert o["live_by_state"] == EXPECTED["live"]
    [partly] = [r for r in o["routes"] if r["route"] == "customer.setCustomer" and r["state"] == "PARTLY_FAILED"]
    assert partly["oldest_id"] == ids["oldest_partly_failed"]
    assert partly["oldest_age_seconds"] == EXPECTED["oldest_partly_failed_minutes"] * 60
    f = o["finished"]
    assert f["hour_total"] == {
        "finished": EXPECTED["hour_finished"],
        "failed": EXPECTED["hour_failed"],
        "failure_rate": round(2 / 11, 4),
    }
    assert (f["day_total"]["finished"], f["day_total"]["failed"]) == (EXPECTED["day_finished"], EXPECTED["day_failed"])
    assert len(f["hour"]) == 60 and len(f["day"]) == 96
    # The 8 setCustomer messages finished 5 minutes ago land in one minute's bucket, 2 of them failed.
    five = f["hour"][-6]
    assert (five["finished"], five["failed"], five["failure_rate"]) == (8, 2, 0.25)
    assert f["hour"][-2]["finished"] == 3 and f["hour"][-1]["finished"] == 0
    assert o["confirmations"]["parked_count"] == EXPECTED["parked"]
    assert sorted(p["message_id"] for p in o["confirmations"]["parked"]) == sorted(ids["failed"])
    assert {p["last_error"] for p in o["confirmations"]["parked"]} == {EXPECTED["parked_error"]}  # one line
    assert o["confirmations"]["by_state"]["PENDING"] == EXPECTED["pending_confirmations"]
    assert [p["route"] for p in o["paused_routes"]] == EXPECTED["paused"]


def test_an_empty_store_has_an_empty_overview(store: str) -> None:
    o = overview()
    assert o["routes"] == [] and o["finished"]["day_total"]["finished"] == 0
    assert all(p["finished"] == 0 for p in o["finished"]["hour"])


def test_workers_unknown_when_the_broker_cannot_be_asked(monkeypatch) -> None:
    from openhub.celery import dispatch

    monkeypatch.setenv("OPENHUB_BROKER_URL", "redis://127.0.0.1:9/0")  # nobody listens there
    reset_settings()
    dispatch.reset_app()
    try:
        assert workers(timeout=0.2) == {"available": False, "workers": []}
    finally:
        dispatch.reset_app()
        reset_settings()


def test_workers_lists_the_running_worker(hub) -> None:
    """On both backends (Redis, and the embedded filesystem transport's control folder)."""
    [worker] = hub.workers
    seen = wait_for(lambda: (lambda w: w if w["workers"] else None)(workers(timeout=1.0)), 60, "a worker to answer")
    assert seen["available"] and any(name.startswith(f"{worker.name}@") for name in seen["workers"]), seen
