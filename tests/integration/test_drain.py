"""The drain switch (issue 13, part 7) on LocalHub: before maintenance new messages are refused and
none starts, while the chains under way finish; ending it takes the held-back messages again."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import openhub
from openhub.api.app import create_app
from openhub.cli import main
from openhub.core.config import get_settings
from openhub.core.errors import Draining
from openhub.service import actions as operator
from openhub.service import pauses
from openhub.store import audit
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
    assert operator.drain_status() == {"draining": True, "reason": "release 4.2", "hold_retries": True, "under_way": 0}
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


def test_a_drain_of_new_messages_only_refuses_them_and_lets_the_stored_ones_and_their_retries_go_on(
    hub: LocalHub,
) -> None:
    """The drain split in two (issue 36): `hold_retries=False` refuses new messages only; a message stored
    before it starts, and one failed before it is retried when due. Draining again switches to holding them."""
    routes.HOOKS.clear()
    failed_once: list[int] = []

    def fail_once(ctx) -> None:
        if ctx.message.id not in failed_once:
            failed_once.append(ctx.message.id)
            raise RuntimeError("the system is away for a moment")

    retried = hub.submit("p.flow", {}, correlation_id="retried")
    routes.HOOKS["first"] = fail_once
    hub.run()
    assert hub.get(retried.id).state == "PARTLY_FAILED"
    stored = hub.submit("p.flow", {}, correlation_id="stored")  # its chain waits in the broker
    assert operator.drain("release 5", hold_retries=False) == 0
    assert operator.drain_status()["hold_retries"] is False
    with pytest.raises(Draining, match="release 5"):
        hub.submit("p.flow", {}, correlation_id="refused")
    hub.run()
    hub.tick(seconds=3600)  # the retry's time has come
    assert hub.get(stored.id).state == "OK" and hub.get(retried.id).state == "OK"
    routes.HOOKS.clear()
    assert operator.undrain() == 0  # it held none back
    waiting = hub.submit("p.flow", {}, correlation_id="waits")
    operator.drain("release 5", hold_retries=False)
    operator.drain("release 5b")  # switched: the stored ones are held back as well
    assert operator.drain_status() == {"draining": True, "reason": "release 5", "hold_retries": True, "under_way": 0}
    hub.run()
    assert hub.get(waiting.id).state == "POSTPONED"
    assert operator.undrain() == 1
    hub.run()
    assert hub.get(waiting.id).state == "OK"
    drains = [e["new_value"] for e in audit.entries(action="hub.drain", limit=10, url=get_settings().database_url)]
    assert '"hold_retries": true' in drains[0] and '"hold_retries": false' in drains[1], drains


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
        new_only = client.put("/api/v1/drain", json={"hold_retries": False}, headers=admin)
        assert new_only.status_code == 200 and new_only.json()["hold_retries"] is False
        assert client.post("/api/v1/messages/p/flow", json={}, headers=crm).status_code == 503
        assert client.get("/api/v1/overview", headers=admin).json()["drain_holds_retries"] is False
        shown = CliRunner().invoke(main, ["status", "--no-workers"]).output
        assert "new messages are refused, the stored ones go on" in shown, shown
        assert client.delete("/api/v1/drain", headers=admin).json()["redriven"] == 0
    runner = CliRunner()
    assert "new messages only" in runner.invoke(main, ["drain", "--new-only"]).output
    assert runner.invoke(main, ["drain", "--off"]).output.startswith("not draining")
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
    redrive = pauses.redrive_due_messages

    def tick_first(hub, now, only_ids=None):
        redrive(hub, now)  # the tick, with every due message
        return redrive(hub, now, only_ids=only_ids)

    monkeypatch.setattr(pauses, "redrive_due_messages", tick_first)
    assert operator.resume("p.flow") == 2
    hub.run()
    assert {hub.get(m.id).state for m in held} == {"OK"}
