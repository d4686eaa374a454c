"""Live configuration (issue 36, item 5) over the HTTP API, on both backends: an admin sees every setting in
force and where it came from, changes a live one and forgets it again, each change audited once; a bad value,
a setting read only at start-up and an unknown name are refused with a message naming them, nothing stored;
a viewer and an operator may not change (or read) the configuration. (A change used by another process, a real
worker, and the CLI's view: tests/integration/test_live_config.py.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select

from openhub.core.config import get_settings
from openhub.store import audit, tokens
from openhub.store.schema import live_settings
from tests.support.process_store import transaction


@pytest.fixture
def admin_token(api_env) -> dict[str, Any]:
    """A named admin token (unique: the store outlives the test), and every live value forgotten after."""
    name = f"cfg-admin-{uuid.uuid4().hex[:8]}"
    yield {
        "name": name,
        "headers": {"Authorization": f"Bearer {tokens.add(name, 'admin', url=get_settings().database_url)}"},
    }
    with transaction() as conn:
        conn.execute(live_settings.delete())


def _setting(shown: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in shown["process"]["settings"] if r["name"] == name)


def _stored() -> dict[str, str]:
    with transaction() as conn:
        return {r.name: r.value for r in conn.execute(select(live_settings))}


def test_an_admin_changes_a_live_setting_and_forgets_it_each_change_audited_once(client, admin_token):
    admin, who = admin_token["headers"], admin_token["name"]
    shown = client.get("/api/v1/config", headers=admin)
    assert shown.status_code == 200, shown.text
    assert _setting(shown.json(), "OPENHUB_MAX_FAILS")["source"] in ("default", "environment")
    assert _setting(shown.json(), "OPENHUB_RETRY_INTERVAL") == {
        "name": "OPENHUB_RETRY_INTERVAL",
        "value": "0.3",
        "source": "environment",
        "live": True,
    }
    assert "OPENHUB_DATABASE_URL" not in shown.json()["live"]
    r = client.put("/api/v1/config/OPENHUB_MAX_FAILS", json={"value": "7", "reason": "flaky partner"}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["value"] == "7" and r.json()["source"] == "store"
    assert _stored() == {"OPENHUB_MAX_FAILS": "7"}
    shown = client.get("/api/v1/config", headers=admin).json()
    assert _setting(shown, "OPENHUB_MAX_FAILS") == {
        "name": "OPENHUB_MAX_FAILS",
        "value": "7",
        "source": "store",
        "live": True,
    }
    assert shown["values"][0]["set_by"] == who and shown["values"][0]["reason"] == "flaky partner"
    api = [p for p in shown["processes"] if p["kind"] == "api"]
    assert api and {"name": "OPENHUB_MAX_FAILS", "value": "7", "source": "store", "live": True} in api[0]["settings"]
    assert client.app.state.hub.settings.max_fails == 7  # this process at once; the others within a poll
    r = client.put("/api/v1/config/OPENHUB_MAX_FAILS", json={"value": "9"}, headers=admin)
    assert r.status_code == 200 and r.json()["previous"] == "7"
    r = client.delete("/api/v1/config/OPENHUB_MAX_FAILS", headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["source"] in ("default", "environment") and r.json()["previous"] == "9"
    assert _stored() == {} and client.app.state.hub.settings.max_fails == 3
    assert client.delete("/api/v1/config/OPENHUB_MAX_FAILS", headers=admin).status_code == 404  # none to forget
    trail = audit.entries(who=who, url=get_settings().database_url)
    assert [e["action"] for e in trail] == ["config.unset", "config.set", "config.set"]
    assert [e["target"] for e in trail] == ["OPENHUB_MAX_FAILS"] * 3
    assert trail[2]["old_value"] is None and '"value": "7"' in trail[2]["new_value"]
    assert trail[1]["old_value"] == "7" and trail[0]["old_value"] == "9"


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("OPENHUB_RETRY_INTERVAL", "soon", "OPENHUB_RETRY_INTERVAL must be a number of seconds"),
        ("OPENHUB_RETRY_INTERVAL", "-1", "OPENHUB_RETRY_INTERVAL must not be negative"),
        ("OPENHUB_MAX_FAILS", "3.5", "OPENHUB_MAX_FAILS must be an integer"),
        ("OPENHUB_SYSTEM_LIMITS", "billing=0", "OPENHUB_SYSTEM_LIMITS: billing must allow at least 1"),
        ("OPENHUB_SYSTEM_RATES", "billing=many", "OPENHUB_SYSTEM_RATES: billing='many' is not CALLS/SECONDS"),
        ("OPENHUB_WEBHOOK_STATES", "NEW", "OPENHUB_WEBHOOK_STATES must name message states other than NEW"),
        ("OPENHUB_LOG_LEVEL", "loud", "OPENHUB_LOG_LEVEL must be one of debug"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting_and_nothing_is_stored(client, admin_token, name, value, says):
    r = client.put(f"/api/v1/config/{name}", json={"value": value}, headers=admin_token["headers"])
    assert r.status_code == 400 and says in r.json()["detail"], r.text
    assert _stored() == {} and audit.entries(who=admin_token["name"], url=get_settings().database_url) == []


def test_a_setting_read_at_start_up_is_refused_as_needing_a_restart_and_an_unknown_one_as_unknown(client, admin_token):
    admin = admin_token["headers"]
    r = client.put("/api/v1/config/OPENHUB_DATABASE_URL", json={"value": "sqlite:///x.db"}, headers=admin)
    assert r.status_code == 409 and "not safe to change at run time" in r.json()["detail"], r.text
    assert "restart" in r.json()["detail"] and "OPENHUB_DATABASE_URL" in r.json()["detail"]
    assert client.delete("/api/v1/config/OPENHUB_POLL_INTERVAL", headers=admin).status_code == 409
    r = client.put("/api/v1/config/OPENHUB_NO_SUCH", json={"value": "1"}, headers=admin)
    assert r.status_code == 404 and "OPENHUB_NO_SUCH is not an openhub setting" in r.json()["detail"], r.text
    assert _stored() == {} and audit.entries(who=admin_token["name"], url=get_settings().database_url) == []


def test_a_viewer_and_an_operator_may_not_read_or_change_the_configuration(client, admin_token):
    suffix = uuid.uuid4().hex[:8]
    for role in ("viewer", "operator"):
        headers = {
            "Authorization": f"Bearer {tokens.add(f'cfg-{role}-{suffix}', role, url=get_settings().database_url)}"
        }
        for method, body in (("GET", None), ("PUT", {"value": "5"}), ("DELETE", None)):
            path = "/api/v1/config" + ("" if method == "GET" else "/OPENHUB_MAX_FAILS")
            r = client.request(method, path, headers=headers, json=body)
            assert r.status_code == 403 and "needs the role admin" in r.json()["detail"], (role, method, r.text)
    assert _stored() == {}
