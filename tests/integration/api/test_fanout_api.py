"""Fan-out over HTTP (issue 37, part 2): the source system POSTs a topic's message once and is answered once,
with the family's id and each receiver's; GET of the family shows each receiver's outcome, and of a receiver
its family, to the source system's own key."""

from __future__ import annotations

import pytest

from tests.integration.api.conftest import ADMIN, CRM, SHOP
from tests.support.waiting import wait_final

pytestmark = pytest.mark.usefixtures("hub")
RECEIVERS = ["dlvsub.billing", "dlvsub.crm", "dlvsub.warehouse"]


def test_one_post_answers_with_the_family_and_its_receivers_and_each_outcome_can_be_read(
    client, cid, prefix, external
) -> None:
    external.fail(f"{prefix}/warehouse", 1, status=400)
    headers = {**CRM, "X-Correlation-Id": cid}
    r = client.post("/api/v1/messages/dlv/published", json={"prefix": prefix}, headers=headers)
    assert r.status_code == 202, r.text
    answer = r.json()
    assert (answer["route"], answer["state"], answer["duplicate"]) == ("dlv.published", "OK", False)
    receivers = answer["receivers"]
    assert [x["route"] for x in receivers] == RECEIVERS
    assert [x["correlation_id"] for x in receivers] == [f"{cid}#0.{n}" for n in (1, 2, 3)]
    ends = {x["route"]: wait_final(x["id"]).state for x in receivers}
    assert ends == {"dlvsub.billing": "OK", "dlvsub.crm": "OK", "dlvsub.warehouse": "FAILED"}

    again = client.post("/api/v1/messages/dlv/published", json={"prefix": prefix}, headers=headers)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert [x["id"] for x in again.json()["receivers"]] == [x["id"] for x in receivers]  # nothing new
    assert [x["state"] for x in again.json()["receivers"]] == ["OK", "OK", "FAILED"]

    family = client.get(f"/api/v1/messages/{answer['id']}", headers=CRM).json()
    assert [(c["id"], c["route"], c["state"]) for c in family["children"]] == [
        (x["id"], x["route"], ends[x["route"]]) for x in receivers
    ]
    assert [h["event"] for h in family["history"]] == ["accepted", "fanned_out"]
    receiver = client.get(f"/api/v1/messages/{receivers[2]['id']}", headers=CRM).json()
    assert receiver["parent_id"] == answer["id"] and receiver["state"] == "FAILED"
    assert client.get(f"/api/v1/messages/{answer['id']}", headers=SHOP).status_code == 404  # another system's
    assert client.post(f"/api/v1/messages/{answer['id']}:restart", headers=ADMIN).status_code == 409
    restarted = client.post(f"/api/v1/messages/{receivers[2]['id']}:restart", headers=ADMIN)
    assert restarted.status_code == 200, restarted.text
    assert wait_final(receivers[2]["id"]).state == "OK"


def test_the_route_listing_shows_a_topics_subscribers_and_what_a_route_subscribes_to(client) -> None:
    listed = {r["route"]: r for r in client.get("/api/v1/routes", headers=ADMIN).json()}
    assert listed["dlv.published"]["subscribers"] == RECEIVERS
    assert listed["dlvsub.crm"]["subscribes"] == ["dlv.published"] and listed["dlvsub.crm"]["subscribers"] is None
    assert listed["test.flow"]["subscribes"] == []


def test_a_batch_item_of_a_topic_is_answered_with_its_receivers(client, cid, prefix) -> None:
    batch = {
        "messages": [
            {"route": "dlv.published", "payload": {"prefix": prefix}, "correlation_id": cid},
            {"route": "test.flow", "payload": {"prefix": prefix, "n": 1}, "correlation_id": cid + "-flow"},
        ]
    }
    r = client.post("/api/v1/messages:batch", json=batch, headers=CRM)
    assert r.status_code == 202, r.text
    family, flow = r.json()["messages"]
    assert [x["route"] for x in family["receivers"]] == RECEIVERS and "receivers" not in flow
    for x in family["receivers"]:
        assert wait_final(x["id"]).state == "OK"
    wait_final(flow["id"])
