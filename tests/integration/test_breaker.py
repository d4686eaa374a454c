"""Circuit breakers per external system (issue 13, part 3) on LocalHub: an outage of one system
postpones its steps without burning the messages' retries, one trial step probes it, and its
success lets every waiting message through."""

from __future__ import annotations

from typing import Iterator

import pytest

import openhub
from openhub.core.config import get_settings
from openhub.outbound.http import HttpCall
from openhub.service.overview import overview
from openhub.store.schema import breakers
from openhub.testing import LocalHub
from tests.support import promise_routes as routes
from tests.support.process_store import transaction


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub(
        OPENHUB_BREAKER_FAILURES="3", OPENHUB_BREAKER_OPEN="60", OPENHUB_RETRY_INTERVAL="10", OPENHUB_MAX_FAILS="2"
    ) as local:
        yield local


def _billing_down(ctx):
    raise ConnectionError("billing answered 503")


def test_an_outage_opens_the_breaker_and_postpones_without_failing(hub: LocalHub) -> None:
    routes.HOOKS["bill"] = _billing_down
    ids = [hub.submit("p.billing", {}).id for _ in range(5)]
    hub.run()
    states = [(hub.get(i).state, hub.get(i).failed_count) for i in ids]
    assert states[:3] == [("PARTLY_FAILED", 1)] * 3  # three failures in a row open the breaker...
    assert states[3:] == [("POSTPONED", 0)] * 2  # ...and the rest wait for it, no failure counted
    assert routes.calls("first") == 5  # the other system's step was not held back
    assert [b["system"] for b in overview()["open_breakers"]] == ["billing"]
    for seconds in (15, 30, 45):  # retries due while it is open are postponed too: no message FAILED
        hub.tick(seconds=seconds)
    assert {hub.get(i).state for i in ids} == {"POSTPONED"}
    assert max(hub.get(i).failed_count for i in ids) == 1


def test_a_successful_trial_closes_the_breaker_for_everyone(hub: LocalHub) -> None:
    routes.HOOKS["bill"] = _billing_down
    ids = [hub.submit("p.billing", {}).id for _ in range(4)]
    hub.run()
    routes.HOOKS.pop("bill")  # billing is back
    hub.tick(seconds=61)
    assert [hub.get(i).state for i in ids] == ["OK"] * 4
    assert routes.calls("bill") == 4 and overview()["open_breakers"] == []


def test_a_failed_trial_opens_the_breaker_again_after_one_call(hub: LocalHub) -> None:
    routes.HOOKS["bill"] = _billing_down
    ids = [hub.submit("p.billing", {}).id for _ in range(4)]
    hub.run()
    with transaction() as conn:
        before = conn.execute(breakers.select()).one()
    hub.tick(seconds=61)  # one trial, still down: open again for another period
    with transaction() as conn:
        after = conn.execute(breakers.select()).one()
    assert after.failures == before.failures + 1 and after.open_until > before.open_until
    assert sum(hub.get(i).failed_count for i in ids) == 4  # three before it opened, and the one trial
    assert openhub.list_messages(state="FAILED") == []  # none failed for waiting


def _bug_before_any_call(ctx):
    return ctx.payload["missing"]  # a KeyError in the step's own code: billing was never called


def test_an_error_before_any_call_does_not_count_against_the_system(hub: LocalHub) -> None:
    """Issue 27: one source system's bad messages must not open a breaker every route shares."""
    routes.HOOKS["bill"] = _bug_before_any_call
    ids = [hub.submit("p.billing", {}).id for _ in range(5)]
    hub.run()
    assert [hub.get(i).state for i in ids] == ["PARTLY_FAILED"] * 5  # each failed on its own...
    assert overview()["open_breakers"] == []  # ...and billing's breaker stayed closed
    with transaction() as conn:
        assert conn.execute(breakers.select()).all() == []


def test_a_request_the_hub_cannot_send_does_not_count_against_the_system(local_store_env, external) -> None:
    """Issue 34 M4: a newline in a payload field a step puts into a header makes httpx refuse the request
    before sending it (LocalProtocolError); five such messages opened billing's breaker for everyone."""
    billing = HttpCall()

    def header_from_payload(ctx):
        billing.post(ctx, f"{external.url}/billing", headers={"X-Customer": ctx.payload["name"]})

    with routes.local_hub(
        **local_store_env, OPENHUB_BREAKER_FAILURES="3", OPENHUB_BREAKER_OPEN="60", OPENHUB_RETRY_INTERVAL="10"
    ) as hub:
        routes.HOOKS["bill"] = header_from_payload
        bad = [hub.submit("p.billing", {"name": "Ada\nX-Injected: 1"}).id for _ in range(5)]
        hub.run()
        assert [(hub.get(i).state, hub.get(i).error_code) for i in bad] == [("PARTLY_FAILED", "INVALID_REQUEST")] * 5
        good = hub.submit("p.billing", {"name": "Grace"}).id
        hub.run()
        assert hub.get(good).state == "OK"  # not POSTPONED behind a breaker others' payloads opened
        assert overview()["open_breakers"] == []
        with transaction() as conn:
            assert [r.failures for r in conn.execute(breakers.select())] in ([], [0])


def test_an_operator_forces_the_breaker_open_and_resets_it_with_a_reason_audited(hub: LocalHub) -> None:
    """Issue 36: billing announced maintenance: the operator opens its breaker before any call fails, and
    closes it when billing is back; both are in the audit trail with the reason."""
    from openhub.core.errors import InputError, NotFound
    from openhub.service import actions as operator
    from openhub.store import audit

    with pytest.raises(NotFound, match="no step calls a system named 'nope'"):
        operator.open_breaker("nope", "maintenance")
    with pytest.raises(InputError, match="give a reason"):
        operator.open_breaker("billing", " ")
    opened = operator.open_breaker("billing", "billing maintenance until 10:00", seconds=600)
    assert opened["open"] and opened["reason"] == "billing maintenance until 10:00"
    ids = [hub.submit("p.billing", {}).id for _ in range(2)]
    hub.run()
    assert [(hub.get(i).state, hub.get(i).failed_count) for i in ids] == [("POSTPONED", 0)] * 2
    assert routes.calls("bill") == 0
    assert [b["reason"] for b in overview()["open_breakers"]] == ["billing maintenance until 10:00"]
    closed = operator.reset_breaker("billing", "billing is back")
    assert not closed["open"] and closed["failures"] == 0
    hub.tick(seconds=601)
    assert [hub.get(i).state for i in ids] == ["OK"] * 2 and routes.calls("bill") == 2
    [reset, forced] = audit.entries(action=None, limit=2, url=get_settings().database_url)
    assert (forced["action"], reset["action"]) == ("breaker.open", "breaker.reset")
    assert forced["target"] == "system billing" and "billing maintenance until 10:00" in forced["new_value"]
    assert "billing is back" in reset["new_value"] and '"open": true' in reset["old_value"]
