"""Issue 35: an app built for a hub other than the process's (`create_app(hub=...)`, `create_app(settings=...)`)
serves that hub in every endpoint: its settings, its routes, its store and its clock, never the process's."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import update

from openhub.api.app import create_app
from openhub.api.auth import Credentials
from openhub.service import reads
from openhub.store.queries import MessageFilter
from openhub.store.schema import messages
from openhub.testing import LocalHub
from tests.support import promise_routes as routes
from tests.support.process_store import forbid_process_settings

KEY = "served-key-" + "k" * 32
ADMIN_TOKEN = "served-admin-" + "a" * 32
METRICS_TOKEN = "served-metrics-" + "m" * 32
CREDENTIALS = Credentials({"CONFIRMED": KEY}, ADMIN_TOKEN, metrics_token=METRICS_TOKEN)
SOURCE = {"Authorization": f"Bearer {KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TRACE = "0af7651916cd43dd8448eb211c80319c"


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_every_endpoint_serves_the_hub_the_app_was_built_for(monkeypatch) -> None:
    """The process's hub is a second LocalHub (opened after, other settings, its own store), and the process's
    database URL cannot be read at all while the app serves: each endpoint converted reads the served hub's.
    Before, the submissions (single, batch, a topic's receivers), a sync route's wait, the search, the count,
    the detail (its trace link from the process's OPENHUB_TRACE_URL), /readyz and /metrics read the process's."""
    with routes.local_hub(OPENHUB_TRACE_URL="https://traces.served/{trace_id}") as served:
        assert served.hub is not None
        hub = served.hub
        quoted = served.submit("p.sync", {}, correlation_id="sync-1")
        waiting = served.submit("p.flow", {}, correlation_id="flow-1")
        served.run(limit=1)  # the sync route's message ends; the flow's waits
        with hub.transaction() as conn:
            traced = update(messages).where(messages.c.id == waiting.id)
            conn.execute(traced.values(traceparent=f"00-{TRACE}-b7ad6b7169203331-01"))
        with (
            LocalHub(routes.__name__, OPENHUB_TRACE_URL="https://traces.process/{trace_id}") as process,
            TestClient(create_app(hub=hub, credentials=CREDENTIALS)) as client,
        ):
            assert process.hub is not None
            forbid_process_settings(monkeypatch)

            one = client.post("/api/v1/messages/p/flow", json={}, headers={**SOURCE, "X-Correlation-Id": "api-1"})
            assert one.status_code == 202, one.text
            batch = client.post(
                "/api/v1/messages:batch",
                json={"messages": [{"route": "p.flow", "payload": {}, "correlation_id": "api-2"}]},
                headers=SOURCE,
            )
            assert batch.status_code == 202, batch.text
            topic = client.post("/api/v1/messages/p/published", json={}, headers={**SOURCE, "X-Correlation-Id": "t-1"})
            assert topic.status_code == 202, topic.text
            assert [r["route"] for r in topic.json()["receivers"]] == list(routes.RECEIVERS)
            again = client.post(
                "/api/v1/messages/p/sync", json={}, headers={**SOURCE, "X-Correlation-Id": "sync-1", "Prefer": "wait=5"}
            )
            assert again.status_code == 200 and again.json()["id"] == quoted.id and "result" in again.json(), again.text

            listed = client.get("/api/v1/messages", params={"limit": 1000}, headers=ADMIN)
            assert listed.status_code == 200, listed.text
            ids = {m["id"] for m in listed.json()["items"]}
            submitted = [one.json()["id"], batch.json()["messages"][0]["id"], topic.json()["id"]]
            assert {quoted.id, waiting.id, *submitted} <= ids
            count = client.get("/api/v1/messages:count", headers=ADMIN)
            assert count.status_code == 200 and count.json() == {"total": len(ids)}, count.text
            detail = client.get(f"/api/v1/messages/{waiting.id}", headers=ADMIN)
            assert detail.status_code == 200, detail.text
            assert detail.json()["trace_url"] == f"https://traces.served/{TRACE}"

            ready = client.get("/readyz")
            assert ready.json()["checks"]["database"] == "ok", ready.text
            scraped = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
            assert scraped.status_code == 200, scraped.text
            assert _sample(scraped.text, "openhub_messages", route="p.flow", state="NEW") == 3, scraped.text

            cancelled = client.post("/api/v1/messages:cancel", json={"route": "p.flow"}, headers=ADMIN)
            assert cancelled.status_code == 200 and len(cancelled.json()["done"]) == 3, cancelled.text
            monkeypatch.undo()
            assert reads.count(MessageFilter(), hub=process.hub) == 0  # nothing reached the process's store


def test_an_app_built_from_settings_serves_the_hub_they_describe_not_the_process_s(monkeypatch) -> None:
    """`create_app(settings=X)` built its hub as the process's with X's settings: its database was X's, but its
    routes and its publisher stayed the process's. It builds the hub X describes (`Hub.build`): X's routes, X's
    store, a publisher of X's, while the process's hub (a LocalHub of other routes, opened after) points
    elsewhere."""
    from openhub.celery.dispatch import CeleryPublisher

    with routes.local_hub() as served:
        assert served.hub is not None
        settings = served.hub.settings
        waiting = served.submit("p.flow", {}, correlation_id="flow-x")
        with (
            LocalHub("tests.support.routes") as process,
            TestClient(create_app(settings=settings, credentials=CREDENTIALS)) as client,
        ):
            assert process.hub is not None
            hub = client.app.state.hub  # type: ignore[attr-defined]
            assert hub is not process.hub and hub.settings is settings
            assert "p.flow" in hub.registry.routes and "test.flow" not in hub.registry.routes  # X's routes
            assert isinstance(hub.publisher, CeleryPublisher) and hub.publisher.settings is settings
            forbid_process_settings(monkeypatch)

            detail = client.get(f"/api/v1/messages/{waiting.id}", headers=ADMIN)
            assert detail.status_code == 200 and detail.json()["correlation_id"] == "flow-x", detail.text
            listed = client.get("/api/v1/routes", headers=ADMIN)
            assert listed.status_code == 200 and "p.flow" in listed.text and "test.flow" not in listed.text
            monkeypatch.undo()
            assert reads.count(MessageFilter(), hub=process.hub) == 0  # the process's store: none of X's
