"""Message expiry (issue 13, part 6): a message not started by its expiry time ends FAILED with error
code EXPIRED and is confirmed so, whether it waited in the broker, behind a retry or was never taken.
In-process on LocalHub, whose clock the tests move forward.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Iterator

import pytest

import openhub
from openhub.core.errors import InputError
from openhub.store.db import utcnow
from openhub.testing import LocalHub
from tests.support import promise_routes as routes


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub(OPENHUB_RETRY_INTERVAL="60") as local:
        yield local


def _expired(hub: LocalHub, message_id: int) -> bool:
    view = hub.get(message_id)
    return view.state == "FAILED" and view.error_code == "EXPIRED" and "expired at" in (view.failed_error or "")


def test_a_message_not_started_before_its_routes_expiry_fails_and_is_confirmed(hub: LocalHub) -> None:
    view = hub.submit("p.expiring", {})
    assert view.expires_at == view.received_at + timedelta(minutes=10)
    hub.run(seconds=11 * 60)  # its chain waited in the broker for eleven minutes
    assert _expired(hub, view.id)
    assert routes.calls("first") == 0
    hub.tick(seconds=11 * 60)  # the confirmation goes out when it is due, on LocalHub's clock
    assert routes.CONFIRMED == [(view.id, "FAILED")]
    assert [v.id for v in openhub.list_messages(error_code="EXPIRED")] == [view.id]


def test_a_retry_due_after_the_expiry_is_not_made(hub: LocalHub) -> None:
    def fails_first_time(ctx):
        if ctx.message.failed_count == 0:
            raise RuntimeError("billing answered 503")

    routes.HOOKS["first"] = fails_first_time
    view = hub.submit("p.expiring", {})
    hub.run()
    assert hub.get(view.id).state == "PARTLY_FAILED"
    hub.tick(seconds=11 * 60)
    assert _expired(hub, view.id)
    assert routes.calls("first") == 0


def test_a_message_started_in_time_is_carried_out(hub: LocalHub) -> None:
    view = hub.submit("p.expiring", {})
    hub.run(seconds=9 * 60)
    assert hub.get(view.id).state == "OK"
    assert routes.calls("first") == 1 and routes.calls("second") == 1


def test_a_messages_own_expiry_applies_when_earlier_than_its_routes(hub: LocalHub) -> None:
    now = utcnow()
    own = hub.submit("p.flow", {}, expires_at=now + timedelta(minutes=1))  # a route without expiry
    later = hub.submit("p.expiring", {}, expires_at=(now + timedelta(hours=5)).isoformat() + "Z")
    assert later.expires_at == later.received_at + timedelta(minutes=10)  # the route's limit is the latest
    hub.run(seconds=120)
    assert _expired(hub, own.id) and hub.get(later.id).state == "OK"


def test_an_expiry_already_past_is_refused_and_nothing_stored(hub: LocalHub) -> None:
    with pytest.raises(InputError, match="already passed"):
        hub.submit("p.flow", {}, correlation_id="late", expires_at=utcnow() - timedelta(seconds=1))
    assert openhub.list_messages(correlation_id="late") == []


def test_an_operator_restart_carries_out_an_expired_message(hub: LocalHub) -> None:
    view = hub.submit("p.expiring", {})
    hub.run(seconds=11 * 60)
    assert _expired(hub, view.id)
    assert openhub.restart(view.id).expires_at is None
    hub.run(seconds=11 * 60)
    assert hub.get(view.id).state == "OK" and routes.calls("first") == 1


def test_split_children_expire_with_their_parent(hub: LocalHub) -> None:
    parent = hub.submit("p.big_expiring", {"children": 2})
    hub.run()
    children = openhub.list_messages(parent_id=parent.id)
    assert len(children) == 2
    assert {c.expires_at for c in children} == {hub.get(parent.id).expires_at}
