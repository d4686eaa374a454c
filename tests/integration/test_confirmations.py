"""Parked confirmations listed and sent again (issue 13, part 5): Python, HTTP and the CLI, on LocalHub."""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import openhub
from openhub.api.app import create_app
from openhub.cli import main
from openhub.core.errors import NotFound, StateConflict
from openhub.service.confirmations import resend, resend_parked
from openhub.testing import LocalHub
from tests.support import promise_routes as routes

ADMIN = "confirmations-admin-" + "x" * 32


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub(OPENHUB_CONFIRM_MAX_FAILS="1", OPENHUB_ADMIN_TOKEN=ADMIN) as local:
        yield local


def _unreachable(outcome):
    raise ConnectionError("the CRM is down")


def _parked(hub: LocalHub, count: int, confirm=_unreachable) -> list[int]:
    """Messages whose confirmation failed its one attempt: parked (FAILED_END)."""
    routes.HOOKS["confirm"] = confirm
    ids = [hub.submit("p.flow", {}).id for _ in range(count)]
    hub.run()
    routes.HOOKS.pop("confirm")
    assert [c["message_id"] for c in openhub.list_confirmations(state="FAILED_END")] == ids[::-1]
    return ids


def test_a_parked_confirmation_is_sent_again_once_and_only_when_parked(hub: LocalHub) -> None:
    first, second = _parked(hub, 2)
    row = openhub.list_confirmations(message_id=first)[0]
    assert row["source_system"] == "CONFIRMED" and "the CRM is down" in row["last_error"]
    again = resend(row["id"])
    assert again["state"] == "OK" and again["attempts"] == 1
    assert routes.CONFIRMED == [(first, "OK")]
    with pytest.raises(StateConflict, match="only a parked"):
        resend(row["id"])
    with pytest.raises(NotFound):
        resend(987654321)
    assert resend_parked(source_system="ANOTHER") == []
    assert resend_parked() == [openhub.list_confirmations(message_id=second)[0]["id"]]
    hub.tick()  # the poller sends what is due
    assert routes.CONFIRMED == [(first, "OK"), (second, "OK")]


def test_confirmations_over_http(hub: LocalHub) -> None:
    first, second = _parked(hub, 2)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with TestClient(create_app()) as client:
        listed = client.get("/api/v1/confirmations", params={"state": "FAILED_END"}, headers=auth)
        assert listed.status_code == 200
        assert [c["message_id"] for c in listed.json()] == [second, first]
        assert listed.json()[0]["last_error"] == "ConnectionError: the CRM is down"  # its last line only
        assert client.get("/api/v1/confirmations", params={"state": "LOST"}, headers=auth).status_code == 400
        assert client.get("/api/v1/confirmations").status_code == 401
        one = listed.json()[1]["id"]
        sent = client.post(f"/api/v1/confirmations/{one}/resend", headers=auth)
        assert sent.status_code == 200 and sent.json()["state"] == "OK"
        assert client.post(f"/api/v1/confirmations/{one}/resend", headers=auth).status_code == 409
        rest = client.post("/api/v1/confirmations:resend", json={"source_system": "CONFIRMED"}, headers=auth)
        assert rest.status_code == 200 and rest.json() == {"resent": [listed.json()[0]["id"]]}
    hub.tick()
    assert sorted(routes.CONFIRMED) == sorted([(first, "OK"), (second, "OK")])


def test_the_api_lists_and_resends_the_confirmations_of_the_hub_it_serves(hub: LocalHub) -> None:
    """Issue 35: an app serving a hub other than the process's (`create_app(hub=...)`; here the process's
    is a second LocalHub, opened after) listed and resent the confirmations of the process's store, looked its
    named operator tokens up there, and read its audit trail there."""
    from openhub.store import audit, tokens

    first, second = _parked(hub, 2)
    assert hub.hub is not None
    url = hub.hub.settings.database_url
    auth = {"Authorization": f"Bearer {tokens.add('served-operator', 'operator', url=url)}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with (
        LocalHub(routes.__name__, source_system="CONFIRMED") as other,
        TestClient(create_app(hub=hub.hub)) as client,
    ):
        assert other.hub is not None and openhub.list_confirmations() == []  # the process's: the other's store
        listed = client.get("/api/v1/confirmations", params={"state": "FAILED_END"}, headers=auth).json()
        assert [c["message_id"] for c in listed] == [second, first]
        sent = client.post(f"/api/v1/confirmations/{listed[1]['id']}/resend", headers=auth)
        assert sent.status_code == 200 and sent.json()["state"] == "OK"
        rest = client.post("/api/v1/confirmations:resend", json={}, headers=auth)
        assert rest.status_code == 200 and rest.json() == {"resent": [listed[0]["id"]]}
        assert [t["name"] for t in client.get("/api/v1/tokens", headers=admin).json()] == ["served-operator"]
        trail = client.get("/api/v1/audit", params={"who": "served-operator"}, headers=admin).json()
        assert [e["action"] for e in trail] == ["confirmation.resend_parked", "confirmation.resend"]
        assert audit.entries(who="served-operator", url=other.hub.settings.database_url) == []
    assert routes.CONFIRMED == [(first, "OK")]


def test_a_confirmation_refused_by_raise_for_status_is_listed_by_its_status_and_url(hub: LocalHub) -> None:
    def unavailable(outcome):
        httpx.Response(503, request=httpx.Request("POST", "https://crm.example/confirmations")).raise_for_status()

    (only,) = _parked(hub, 1, unavailable)
    line = "HTTP 503 from https://crm.example/confirmations"
    with TestClient(create_app()) as client:
        listed = client.get(
            "/api/v1/confirmations", params={"message_id": only}, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        # Issue 40: the overview, the first screen an operator sees, listed the whole traceback.
        overview = client.get("/api/v1/overview", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        detail = client.get(f"/api/v1/messages/{only}", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert listed.json()[0]["last_error"] == line
    assert [(p["message_id"], p["last_error"]) for p in overview["confirmations"]["parked"]] == [(only, line)]
    [confirmation] = detail["confirmation"]  # the whole text: a click away, in the message's detail
    assert confirmation["last_error_line"] == line and "Traceback" in confirmation["last_error"]
    assert json.loads(CliRunner().invoke(main, ["confirmations", "list", "--json"]).output)[0]["last_error"] == line
    assert line in CliRunner().invoke(main, ["confirmations", "list"], terminal_width=200).output


def test_confirmations_from_the_command_line(hub: LocalHub) -> None:
    (only,) = _parked(hub, 1)
    runner = CliRunner()
    listed = runner.invoke(main, ["confirmations", "list", "--state", "failed_end", "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.output)
    assert row["message_id"] == only
    assert "CONFIRMED" in runner.invoke(main, ["confirmations", "list"]).output
    assert runner.invoke(main, ["confirmations", "resend"]).exit_code == 2
    sent = runner.invoke(main, ["confirmations", "resend", str(row["id"])])
    assert sent.exit_code == 0 and f"confirmation {row['id']} sent again: OK" in sent.output
    assert json.loads(runner.invoke(main, ["confirmations", "resend", "--parked", "--json"]).output) == {"resent": []}
