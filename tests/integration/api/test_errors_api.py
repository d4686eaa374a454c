"""GET /api/v1/errors: the error-code catalogue with the messages carrying each code (issue 38)."""

from __future__ import annotations

from sqlalchemy import update

from openhub.core import codes
from openhub.store.schema import messages
from tests.integration.api.conftest import ADMIN, CRM
from tests.support.process_store import transaction


def _carry(message_id: int, code: str) -> None:
    """Give a stored message a last failure's code (as the engine writes it)."""
    with transaction() as conn:
        conn.execute(update(messages).where(messages.c.id == message_id).values(error_code=code))


def test_the_catalogue_lists_every_code_with_its_messages(client, cid, flow_payload):
    ids = [
        client.post(
            "/api/v1/messages/test/flow", json=flow_payload, headers={**CRM, "X-Correlation-Id": f"{cid}-{n}"}
        ).json()["id"]
        for n in range(4)
    ]
    before = {e["code"]: e for e in client.get("/api/v1/errors", headers=ADMIN).json()}
    for message_id, code in zip(ids, [codes.WORKER_LOST, "HTTP_422", "E400", f"Oops{cid[-6:]}"]):
        _carry(message_id, code)
    r = client.get("/api/v1/errors", headers=ADMIN)
    assert r.status_code == 200
    entries = {e["code"]: e for e in r.json()}
    assert set(codes.CATALOGUE) <= set(entries)
    lost = entries[codes.WORKER_LOST]
    assert (lost["retried"], lost["origin"], lost["declared"]) == ("yes", "hub", True)
    assert lost["messages"] == before[codes.WORKER_LOST]["messages"] + 1
    assert lost["meaning"] and lost["action"]
    http = entries[codes.HTTP]
    assert http["statuses"]["HTTP_422"] >= 1 and http["messages"] >= http["statuses"]["HTTP_422"]
    assert entries["E400"]["origin"].startswith("test.") and entries["E400"]["declared"] is True  # a route's own
    oops = entries[f"Oops{cid[-6:]}"]
    assert (oops["declared"], oops["messages"]) == (False, 1)
    # each code links to the messages search by that code, which finds the message
    found = client.get(lost["search"], headers=ADMIN).json()["items"]
    assert ids[0] in [m["id"] for m in found]
    found = client.get(oops["search"], headers=ADMIN).json()["items"]
    assert [m["id"] for m in found] == [ids[3]]


def test_the_catalogue_is_the_operators(client):
    assert client.get("/api/v1/errors", headers=CRM).status_code == 403
    assert client.get("/api/v1/errors").status_code == 401
