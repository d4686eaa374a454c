"""State hooks (issue 13, part 4) on LocalHub: @on_state functions and the stock webhook are told
of each message entering their states, after commit, from a durable row retried like a confirmation."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

import openhub
from openhub.core.errors import ConfigurationError
from openhub.service.confirmations import resend
from openhub.testing import ExternalSystem, LocalHub
from tests.support import promise_routes as routes

HOOK = "tests.support.promise_routes.alert"


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub(OPENHUB_MAX_FAILS="1", OPENHUB_RETRY_INTERVAL="60", OPENHUB_CONFIRM_MAX_FAILS="2") as local:
        yield local


def test_a_hook_hears_of_each_state_it_subscribed_to_once(hub: LocalHub) -> None:
    def down(ctx):
        raise RuntimeError("the CRM answered 503")

    routes.HOOKS["first"] = down
    failing = hub.submit("p.flow", {})
    fine = hub.submit("p.reserve", {}, correlation_id="fine")
    hub.run()
    hub.tick()  # the poller sends the notifications
    assert routes.NOTIFIED == [(failing.id, "PARTLY_FAILED")]
    hub.tick(seconds=61)  # the retry fails too: FAILED (max_fails 1)
    hub.tick(seconds=61)
    assert routes.NOTIFIED == [(failing.id, "PARTLY_FAILED"), (failing.id, "FAILED")]
    assert hub.get(fine.id).state == "OK"  # OK is not one of its states
    rows = openhub.list_confirmations(message_id=failing.id)
    assert {(r["hook"], r["outcome"], r["state"]) for r in rows if r["hook"]} == {
        (HOOK, "PARTLY_FAILED", "OK"),
        (HOOK, "FAILED", "OK"),
    }


def test_a_failing_hook_is_retried_then_parked_and_can_be_sent_again(hub: LocalHub) -> None:
    def down(outcome):
        raise ConnectionError("the alerting service is down")

    routes.HOOKS["alert"] = down
    view = hub.submit("p.reserve", {"raise": "out_of_stock"})  # fatal: FAILED at once
    hub.run()
    hub.tick()
    hub.tick(seconds=61)  # OPENHUB_CONFIRM_MAX_FAILS=2: parked after the second attempt
    (parked,) = [r for r in openhub.list_confirmations(state="FAILED_END") if r["hook"] == HOOK]
    assert parked["message_id"] == view.id and "alerting service is down" in parked["last_error"]
    routes.HOOKS.pop("alert")
    assert resend(parked["id"])["state"] == "OK"
    assert routes.NOTIFIED == [(view.id, "FAILED")]


def test_the_stock_webhook_posts_each_failed_message(external: ExternalSystem) -> None:
    routes.reset()
    path = f"/alerts-{uuid.uuid4().hex}"
    with LocalHub(
        "tests.support.promise_routes",
        source_system="CONFIRMED",
        OPENHUB_WEBHOOK_URL=f"{external.url}{path}",
        OPENHUB_WEBHOOK_STATES="FAILED",
    ) as hub:
        external.fail(path, times=1)  # retried by the poller
        view = hub.submit("p.reserve", {"raise": "out_of_stock"})
        hub.run()
        hub.tick()
        hub.tick(seconds=120)
        posted = [c for c in external.calls if c.path == path and c.status == 200]
        assert len(posted) == 1
        assert posted[0].body["id"] == view.id and posted[0].body["state"] == "FAILED"
        assert posted[0].body["error_code"] == hub.get(view.id).error_code
    routes.reset()


def test_a_hook_on_an_unknown_state_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="@on_state"):
        openhub.on_state("LOST")
    with pytest.raises(ConfigurationError, match="@on_state"):
        openhub.on_state("NEW")
