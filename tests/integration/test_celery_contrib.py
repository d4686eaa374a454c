"""Celery's own in-process test worker (`celery.contrib.pytest`'s `celery_worker`, which conftest.py
imports to shadow pytest-celery's Docker fixtures) carries the hub's routes: a team can test its
route modules and Celery configuration in one process, on a private broker, with no subprocess.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest
from celery import Celery

import openhub
from openhub.api.detail import message_detail
from openhub.celery import dispatch
from openhub.engine.hub import current
from openhub.store.workers import current_node, stop_heartbeat
from tasks.steps import register_step_tasks
from tests.support import backends
from tests.support.checks import assert_each_step_ok_once
from tests.support.waiting import wait_final


@pytest.fixture
def celery_app(backend: backends.Backend, tmp_path: Path) -> Iterator[Celery]:
    """The hub's own Celery app (shadowing celery.contrib.pytest's), on the test store and a broker of
    its own, so that only the in-process worker takes the chains this test publishes."""
    private = dict(backend.env)
    if backend.redis is not None:
        private["OPENHUB_BROKER_URL"] = backend.redis.url.rsplit("/", 1)[0] + "/7"
    else:
        private["OPENHUB_VAR_DIR"] = str(tmp_path / "var")  # the filesystem broker's folders live there
    backends.activate(private)
    app = dispatch.celery_app()
    register_step_tasks(app, current())
    yield app
    stop_heartbeat()  # the worker thread's steps started this process's heartbeat, on this test's store
    backend.activate()


@pytest.fixture
def celery_worker_parameters() -> dict:
    """No ping round trip (the hub's app has no result backend); the hub's queues."""
    return {"perform_ping_check": False, "loglevel": "WARNING"}


@pytest.mark.parametrize("route", ["test.flow", "fused.flow"])
def test_celerys_in_process_worker_carries_a_route(celery_worker, route: str, prefix: str, caplog) -> None:
    view = openhub.submit(route, {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    assert wait_final(view.id, timeout=60).state == "OK"
    assert_each_step_ok_once([view.id], ["a", "b", "c"])
    # Run here, in the test process's worker thread, not by a subprocess worker of the suite; unless this
    # process's heartbeat fell behind (on a loaded box, the embedded store's lock held by the suite's other
    # processes past 3/4 of the test backends' 2 s dead-after): then the fence let its lease go, as it must,
    # and the suite's poller handed the step to one of its own workers. Or the suite's poller judged this
    # process dead meanwhile (its heartbeat thread starved past the 2 s dead-after beside a CPU burner) and
    # repaired the run, which the message's history records as a lost lease or chain.
    fenced = [r.getMessage() for r in caplog.records if "heartbeat fell behind" in r.getMessage()]
    detail = message_detail(current(), view.id)
    workers = {c["worker"] for c in detail["ext_calls"]}
    moved = {h["event"] for h in detail["history"]} & {"lease_expired", "lease_dropped", "chain_lost"}
    assert workers == {current_node()} or fenced or moved, (workers, detail["history"])
