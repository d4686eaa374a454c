"""Authentication and authorisation: API keys per source system, the admin token."""

from __future__ import annotations

import pytest

from openhub.api.auth import Credentials
from tests.integration.api.conftest import ADMIN, CRM, SHOP, bearer, make_client


@pytest.fixture
def message_id(client, cid, flow_payload) -> int:
    r = client.post("/api/v1/messages/test/flow", json=flow_payload, headers={**CRM, "X-Correlation-Id": cid})
    assert r.status_code == 202
    return r.json()["id"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("not-a-key"),
        {"Authorization": "Basic Zm9vOmJhcg=="},
        {"Authorization": "Bearer"},
        bearer(CRM["Authorization"][7:] + "x"),
    ],
)
def test_submit_without_a_valid_key_is_401(client, cid, flow_payload, headers):
    r = client.post("/api/v1/messages/test/flow", json=flow_payload, headers={**headers, "X-Correlation-Id": cid})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Bearer"


def test_a_key_submits_only_as_its_own_system(client, cid, flow_payload):
    r = client.post(
        "/api/v1/messages/test/flow",
        json=flow_payload,
        headers={**SHOP, "X-Correlation-Id": cid, "X-Source-System": "CRM"},
    )
    assert r.status_code == 403
    r = client.post(
        "/api/v1/messages:batch",
        headers=SHOP,
        json={
            "messages": [{"route": "test.flow", "payload": flow_payload, "correlation_id": cid, "source_system": "CRM"}]
        },
    )
    assert r.status_code == 403
    ok = client.post(
        "/api/v1/messages/test/flow",
        json=flow_payload,
        headers={**SHOP, "X-Correlation-Id": cid, "X-Source-System": "SHOP"},
    )
    assert ok.status_code == 202
    assert client.get(f"/api/v1/messages/{ok.json()['id']}", headers=ADMIN).json()["source_system"] == "SHOP"


def test_the_admin_token_cannot_submit(client, cid, flow_payload):
    r = client.post("/api/v1/messages/test/flow", json=flow_payload, headers={**ADMIN, "X-Correlation-Id": cid})
    assert r.status_code == 403


def test_admin_endpoints_need_the_admin_token(client, message_id):
    for method, path in [
        ("POST", f"/api/v1/messages/{message_id}:restart"),
        ("POST", f"/api/v1/messages/{message_id}:cancel"),
        ("POST", "/api/v1/routes/test/held/pause"),
        ("POST", "/api/v1/routes/test/held/resume"),
    ]:
        assert client.request(method, path).status_code == 401, path
        assert client.request(method, path, headers=bearer("wrong")).status_code == 401, path
        assert client.request(method, path, headers=CRM).status_code == 403, path
    for path in ("/api/v1/messages", f"/api/v1/messages/{message_id}", "/api/v1/routes"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers=ADMIN).status_code == 200, path


def test_routes_and_drain_status_are_the_operators_alone(client):
    # Issue 27: the route table (steps, pause reasons) and the drain status (messages under way)
    # answered any source system's key.
    for path in ("/api/v1/routes", "/api/v1/drain"):
        for key in (CRM, SHOP):
            r = client.get(path, headers=key)
            assert r.status_code == 403, path
            assert r.json()["status"] == 403 and "needs an operator token" in r.json()["detail"]
        assert client.get(path, headers=ADMIN).status_code == 200, path


def test_a_source_system_reads_only_its_own_messages(client, message_id):
    assert client.get(f"/api/v1/messages/{message_id}", headers=CRM).status_code == 200
    assert client.get(f"/api/v1/messages/{message_id}", headers=SHOP).status_code == 404
    mine = client.get("/api/v1/messages", headers=SHOP).json()["items"]
    assert all(m["source_system"] == "SHOP" for m in mine)
    assert client.get("/api/v1/messages", params={"source_system": "CRM"}, headers=SHOP).status_code == 403
    assert client.post(f"/api/v1/messages/{message_id}:response", json={}, headers=SHOP).status_code == 404


def test_no_admin_token_configured_closes_the_admin_endpoints(api_env, message_id):
    with make_client(credentials=Credentials({"CRM": "k"}, None)) as c:
        assert c.post(f"/api/v1/messages/{message_id}:restart", headers=bearer("")).status_code == 401
        assert c.get("/api/v1/routes", headers=bearer("None")).status_code == 401


def test_dev_mode_generates_and_prints_credentials(api_env):
    from openhub.api.app import create_app, with_settings

    printed: list[str] = []
    app = create_app(dev=True, settings=with_settings(api_keys={}, admin_token=None), announce=printed.append)
    creds = app.state.credentials
    assert creds.api_keys["CRM"] in printed[0] and creds.admin_token in printed[0]
    configured = create_app(dev=True, settings=with_settings(api_keys={"CRM": "fixed"}), announce=printed.append)
    assert configured.state.credentials.api_keys == {"CRM": "fixed"} and len(printed) == 1


def test_admin_page_is_served(client):
    r = client.get("/admin", follow_redirects=True)
    assert r.status_code == 200 and "admin token" in r.text.lower()
    assert r.headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert r.headers["X-Frame-Options"] == "DENY"
    assert client.get("/admin/admin.js").status_code == 200


STRONG = "s" * 40


@pytest.mark.parametrize(
    "keys, admin, url, why",
    [
        ({"CRM": "change-me-crm-key"}, "a" * 40, "", "placeholder"),
        ({"CRM": STRONG}, "change-me-admin-token", "", "placeholder"),
        ({"CRM": "x" * 31}, "a" * 40, "", "shorter than 32"),
        ({"CRM": STRONG, "SHOP": STRONG}, "a" * 40, "", "same secret"),
        ({"CRM": STRONG}, STRONG, "", "same secret"),
        ({"CRM": STRONG}, "a" * 40, "postgresql+psycopg://openhub:change-me@db/openhub", "OPENHUB_DATABASE_URL"),
    ],
)
def test_unsafe_secrets_stop_the_ingress_outside_dev(api_env, keys, admin, url, why):
    from openhub.api.app import create_app, with_settings
    from openhub.core.errors import ConfigurationError

    changes = dict(api_keys=keys, admin_token=admin, **({"database_url": url} if url else {}))
    with pytest.raises(ConfigurationError, match=why) as refused:
        create_app(settings=with_settings(**changes))
    for secret in [*keys.values(), admin]:  # the refusal names the holder, never the secret
        assert secret not in str(refused.value)
    create_app(dev=True, settings=with_settings(**changes), announce=lambda _: None)  # dev takes anything


def test_safe_secrets_start_the_ingress(api_env):
    from openhub.api.app import create_app, with_settings

    app = create_app(settings=with_settings(api_keys={"CRM": STRONG, "SHOP": "t" * 32}, admin_token="a" * 40))
    assert app.state.credentials.api_keys["SHOP"] == "t" * 32


@pytest.mark.parametrize(
    "metrics_token, why",
    [
        ("change-me-metrics-token", "OPENHUB_METRICS_TOKEN is the example"),
        ("m" * 31, "OPENHUB_METRICS_TOKEN is shorter"),
        ("a" * 40, "OPENHUB_ADMIN_TOKEN and OPENHUB_METRICS_TOKEN"),
    ],
)
def test_an_unsafe_metrics_token_stops_the_ingress(api_env, monkeypatch, metrics_token, why):
    from openhub.api.app import create_app, with_settings
    from openhub.core.config import Settings
    from openhub.core.errors import ConfigurationError

    monkeypatch.setenv("OPENHUB_METRICS_TOKEN", metrics_token)
    assert Settings.from_env().metrics_token == metrics_token
    with pytest.raises(ConfigurationError, match=why):
        create_app(settings=with_settings(api_keys={"CRM": STRONG}, admin_token="a" * 40, metrics_token=metrics_token))
    with make_client(
        credentials=None, settings=with_settings(api_keys={"CRM": STRONG}, admin_token="a" * 40, metrics_token="m" * 40)
    ) as c:
        assert c.get("/metrics", headers=bearer("m" * 40)).status_code == 200


def test_a_route_takes_messages_only_from_its_declared_sources(api_env, client, cid, prefix):
    """Issue 27: test.wait declares sources=["CRM", "CONFIRMED"]; SHOP's key is refused there, in every door."""
    import openhub
    from openhub.core.errors import SourceNotAllowed

    r = client.post("/api/v1/messages/test/wait", json={"prefix": prefix}, headers={**SHOP, "X-Correlation-Id": cid})
    assert r.status_code == 403 and "SHOP may not submit test.wait" in r.json()["detail"], r.text
    batch = client.post(
        "/api/v1/messages:batch",
        headers=SHOP,
        json={"messages": [{"route": "test.wait", "payload": {"prefix": prefix}, "correlation_id": cid}]},
    )
    assert batch.status_code == 403 and "SHOP may not submit test.wait" in batch.text, batch.text
    with pytest.raises(SourceNotAllowed, match="SHOP may not submit test.wait"):
        openhub.submit("test.wait", {"prefix": prefix}, source_system="SHOP", correlation_id=cid)
    ok = client.post(
        "/api/v1/messages/test/wait", json={"prefix": prefix, "wait": 60}, headers={**CRM, "X-Correlation-Id": cid}
    )
    assert ok.status_code == 202, ok.text
    assert client.get("/api/v1/messages:count", params={"correlation_id": cid}, headers=ADMIN).json()["total"] == 1


def test_no_responders_declared_means_the_messages_own_source_system_answers(api_env, client, cid, prefix):
    """A route without responders= takes a response from the admin token or the message's own source
    system (as before responders could be named); one that names them, from those only (issue 27)."""
    from openhub.api.auth import Caller
    from openhub.api.messages import may_respond
    from openhub.core.registry import get_registry

    flow = get_registry().route("test.flow")
    assert may_respond(flow, "CRM", Caller(admin=True)) is None
    assert may_respond(flow, "CRM", Caller(source_system="CRM")) is None
    assert may_respond(flow, "CRM", Caller(source_system="SHOP")) == 404
    wait = get_registry().route("test.wait")  # names SHOP as its responder
    assert may_respond(wait, "CRM", Caller(source_system="CRM")) == 403
    assert may_respond(wait, "CRM", Caller(source_system="SHOP")) is None


def test_overlapping_keys_for_rotation_and_pre_hashed_keys(api_env, cid, flow_payload, monkeypatch):
    """Issue 27: OPENHUB_API_KEYS="CRM=old,CRM=new" keeps both during a rotation; a `sha256:` value is
    a key given by its hash; keys are held as hashes only."""
    import hashlib

    from openhub.core.config import Settings

    old, new, third = ("crm-old-" + "o" * 32), ("crm-new-" + "n" * 32), ("crm-third-" + "t" * 32)
    hashed = "sha256:" + hashlib.sha256(third.encode()).hexdigest()
    monkeypatch.setenv("OPENHUB_API_KEYS", f"CRM={old},CRM={new},CRM={hashed}")
    settings = Settings.from_env()
    credentials = Credentials.from_settings(settings)
    assert old not in repr(credentials) and new not in repr(credentials)  # only their hashes are kept
    with make_client(credentials=credentials) as c:
        for key in (old, new, third):
            r = c.post(
                "/api/v1/messages/test/flow",
                json=flow_payload,
                headers={**bearer(key), "X-Correlation-Id": f"{cid}-{key[:9]}"},
            )
            assert r.status_code == 202, r.text
        assert c.get("/api/v1/messages", headers=bearer("crm-old-")).status_code == 401


def test_repeated_auth_failures_from_one_address_get_429(api_env, monkeypatch):
    """Issue 27: after OPENHUB_AUTH_FAILURES wrong keys within OPENHUB_AUTH_WINDOW, the address gets
    429 with Retry-After until the window passes; a counter says so. Issue 34 H1: a right key or the
    admin token from that address is let in (it was 429: anyone could lock every system out)."""
    from prometheus_client import REGISTRY

    from openhub.core.config import Settings

    monkeypatch.setenv("OPENHUB_AUTH_FAILURES", "5")
    monkeypatch.setenv("OPENHUB_AUTH_WINDOW", "60")
    settings = Settings.from_env()  # not the cached settings: later tests keep the defaults
    assert settings.auth_failures == 5

    def limited() -> float:
        return REGISTRY.get_sample_value("openhub_auth_failures_total", {"outcome": "limited"}) or 0.0

    before = limited()
    with make_client(settings=settings) as c:
        answers = [c.get("/api/v1/messages", headers=bearer(f"wrong-{i}")).status_code for i in range(7)]
        assert answers == [401] * 5 + [429] * 2
        blocked = c.get("/api/v1/messages", headers=bearer("wrong-again"))
        assert blocked.status_code == 429 and 0 < int(blocked.headers["Retry-After"]) <= 60
        assert c.get("/api/v1/messages", headers=ADMIN).status_code == 200
        assert c.get("/api/v1/messages", headers=CRM).status_code == 200
        assert c.get("/api/v1/messages", headers=SHOP).status_code == 200
    assert limited() - before == 3
