"""The drain switch (issue 13, part 7) on LocalHub: before maintenance new messages are refused and
none starts, while the chains under way finish; ending it takes the held-back messages again."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import openhub
from openhub import operator
from openhub.api.app import create_app
from openhub.cli import main
from openhub.errors import Draining
from openhub.testing import LocalHub
from tests.support import promise_routes as routes

ADMIN = "drain-admin-" + "x" * 32
CRM = "drain-crm-key-" + "y" * 32


@pytest.fixture
def hub(local_store_env: dict[str, str]) -> Iterator[LocalHub]:
    with routes.local_hub(OPENHUB_ADMIN_TOKEN=ADMIN, OPENHUB_API_KEYS=f"CRM={CRM}", **local_store_env) as local:
        yield local  # a fresh store each test: no drain outlives it


def test_a_drain_lets_the_chain_under_way_finish_and_starts_nothing_new(hub: LocalHub) -> None:
    queued = hub.submit("p.flow", {}, correlation_id="queued")  # its chain waits in the broker
    under_way = hub.submit("p.fused", {}, correlation_id="under-way")
    routes.HOOKS["first"] = lambda ctx: operator.drain("release 4.2") if ctx.message.id == under_way.id else None
    hub.run()  # in order: the queued message, then the one whose first step drains the hub
    assert hub.get(under_way.id).state == "OK"  # drained mid-route: its second step still ran
    with pytest.raises(Draining, match="release 4.2"):
        hub.submit("p.flow", {}, correlation_id="refused")
    assert openhub.list_messages(correlation_id="refused") == []
    assert operator.drain_status() == {"draining": True, "reason": "release 4.2", "under_way": 0}
    assert hub.get(queued.id).state == "OK"  # published and claimed before the drain


def test_a_message_sent_again_during_a_drain_is_refused_too(hub: LocalHub) -> None:
    first = hub.submit("p.flow", {}, correlation_id="again")
    operator.drain("release 4.3")
    with pytest.raises(Draining, match="release 4.3"):
        hub.submit("p.flow", {}, correlation_id="again")
    assert [v.id for v in openhub.list_messages(correlation_id="again")] == [first.id]
    operator.undrain()
    assert hub.submit("p.flow", {}, correlation_id="again").duplicate


def test_messages_waiting_during_a_drain_start_when_it_ends(hub: LocalHub) -> None:
    operator.drain()
    routes.HOOKS.clear()
    with pytest.raises(Draining):
        hub.submit("p.flow", {})
    operator.undrain()
    view = hub.submit("p.flow", {})
    operator.drain()
    hub.run()  # its chain arrives during the drain: postponed at the claim, not started
    assert hub.get(view.id).state == "POSTPONED" and routes.calls("first") == 0
    hub.tick(seconds=3600)  # nor re-driven by the poller meanwhile
    assert hub.get(view.id).state == "POSTPONED" and routes.calls("first") == 0
    assert operator.undrain() == 1
    hub.run()
    assert hub.get(view.id).state == "OK" and routes.calls("first") == 1


def test_a_route_paused_on_its_own_stays_paused_after_a_drain(hub: LocalHub) -> None:
    views = [hub.submit("p.flow", {}), hub.submit("p.leaf", {})]
    openhub.pause("p.leaf")
    operator.drain()
    hub.run()
    assert [hub.get(v.id).state for v in views] == ["POSTPONED", "POSTPONED"]
    operator.undrain()
    hub.run()
    assert [hub.get(v.id).state for v in views] == ["OK", "POSTPONED"]


def test_drain_over_http_and_from_the_command_line(hub: LocalHub) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    crm = {"Authorization": f"Bearer {CRM}", "X-Correlation-Id": "over-http"}
    with TestClient(create_app()) as client:
        assert client.put("/api/v1/drain", headers={"Authorization": f"Bearer {CRM}"}).status_code == 403
        started = client.put("/api/v1/drain", json={"reason": "database upgrade"}, headers=admin)
        assert started.status_code == 200 and started.json()["draining"] is True
        refused = client.post("/api/v1/messages/p/flow", json={}, headers=crm)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "60"
        assert "database upgrade" in refused.json()["detail"]
        assert client.get("/api/v1/overview", headers=admin).json()["draining"] == "database upgrade"
        ended = client.delete("/api/v1/drain", headers=admin)
        assert ended.status_code == 200 and ended.json()["draining"] is False
        assert client.post("/api/v1/messages/p/flow", json={}, headers=crm).status_code == 202
    runner = CliRunner()
    assert "draining (maintenance)" in runner.invoke(main, ["drain", "--reason", "maintenance"]).output
    assert json.loads(runner.invoke(main, ["drain", "--status", "--json"]).output)["draining"] is True
    assert runner.invoke(main, ["drain", "--off"]).output.startswith("not draining")


def test_resume_counts_the_messages_a_poller_tick_redrove_in_between(hub: LocalHub, monkeypatch) -> None:
    # A poller's tick that commits between resume's two transactions re-drives what resume made due (on
    # PostgreSQL it skips the rows the tick holds): resume answered 0 for two messages going on (CI, stop 43).
    operator.pause("p.flow", "maintenance")
    held = [hub.submit("p.flow", {}, correlation_id=f"held-{n}") for n in range(2)]
    hub.run()
    assert {hub.get(m.id).state for m in held} == {"POSTPONED"}
    redrive = operator.redrive_due_messages

    def tick_first(now, only_ids=None):  # noqa: ANN001, ANN202
        redrive(now)  # the tick, with every due message
        return redrive(now, only_ids=only_ids)

    monkeypatch.setattr(operator, "redrive_due_messages", tick_first)
    assert operator.resume("p.flow") == 2
    hub.run()
    assert {hub.get(m.id).state for m in held} == {"OK"}
