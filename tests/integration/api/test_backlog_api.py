"""Back-pressure (issue 37, part 6): past a source system's (OPENHUB_BACKLOG_LIMITS) or a route's
(`backlog_limit`) cap on messages not yet final the ingress answers 429 with Retry-After and stores
nothing; it takes messages again once real workers drained the backlog, and the overview shows it."""

from __future__ import annotations

import uuid

import pytest

import openhub
from openhub.api.auth import Credentials
from tests.integration.api.conftest import ADMIN, ADMIN_TOKEN, bearer, make_client
from tests.support import backends
from tests.support.waiting import wait_final

CAPPED_KEY, OTHER_KEY = "capped-" + uuid.uuid4().hex, "other-" + uuid.uuid4().hex


@pytest.fixture
def capped(hub: backends.Backend):
    """This process (the ingress) with the source system CAPPED capped at 2; the worker as it was."""
    backends.activate(dict(hub.env, OPENHUB_BACKLOG_LIMITS="CAPPED=2"))
    try:
        yield hub
    finally:
        openhub.resume("dlv.capped")
        hub.activate()


def _post(client, key: str, prefix: str):
    return client.post(
        "/api/v1/messages/dlv/capped",
        json={"prefix": prefix},
        headers={**bearer(key), "X-Correlation-Id": uuid.uuid4().hex},
    )


def _backlogs(client) -> list[dict]:
    return client.get("/api/v1/overview", headers=ADMIN).json()["backlogs"]


def test_past_the_cap_the_ingress_answers_429_and_takes_messages_again_once_drained(capped, prefix) -> None:
    openhub.pause("dlv.capped")  # its messages wait, not final, until it is resumed
    credentials = Credentials({"CAPPED": CAPPED_KEY, "OTHER": OTHER_KEY}, ADMIN_TOKEN)
    with make_client(credentials=credentials) as client:
        taken = [_post(client, CAPPED_KEY, prefix) for _ in range(2)]
        assert [r.status_code for r in taken] == [202, 202]
        refused = _post(client, CAPPED_KEY, prefix)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1, refused.text
        assert "CAPPED" in refused.json()["detail"]
        # The route's own cap (3) counts every source system's messages: OTHER gets one place more.
        assert _post(client, OTHER_KEY, prefix).status_code == 202
        assert _post(client, OTHER_KEY, prefix).status_code == 429
        assert openhub.count_messages(source_system="CAPPED", service="dlv", operation="capped") == 2  # none stored
        assert {"source_system": "CAPPED", "backlog": 2, "limit": 2} in _backlogs(client)
        assert {"route": "dlv.capped", "backlog": 3, "limit": 3} in _backlogs(client)
        openhub.resume("dlv.capped")
        for message_id in [r.json()["id"] for r in taken]:
            assert wait_final(message_id).state == "OK"
        for system in ("CAPPED", "OTHER"):
            for view in openhub.list_messages(source_system=system, service="dlv", operation="capped"):
                wait_final(view.id)
        assert _post(client, CAPPED_KEY, prefix).status_code == 202
        assert {"source_system": "CAPPED", "backlog": 1, "limit": 2} in _backlogs(client) or {
            "source_system": "CAPPED",
            "backlog": 0,
            "limit": 2,
        } in _backlogs(client)


def test_a_backlog_limit_is_checked_at_declaration() -> None:
    from openhub.core.errors import ConfigurationError
    from tests.support.delivery_routes import before

    for bad in (0, -1, True, "10"):
        with pytest.raises(ConfigurationError, match="backlog_limit"):
            openhub.Route("x.y", steps=[before], backlog_limit=bad)
