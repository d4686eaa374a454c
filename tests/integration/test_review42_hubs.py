"""Review 42: LocalHubs one after another in one process on the same PostgreSQL store.

What test_chain_round_trips.py's author saw (a second hub "ran a failing step as succeeding", a third "claimed
a paused route's message") is LocalHub's correlation ids: `local-<n>` counts from 1 in each LocalHub, so on a
store another hub used, `submit` answers with that hub's message (a duplicate) and runs nothing. The same on
main before 1cc329c. With ids of their own, each hub fails the failing step and leaves a paused route alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openhub.service.pauses import pause, resume
from openhub.store.migrate import upgrade
from openhub.testing import LocalHub
from tests.support import backends

ROUTES = "tests.support.hop_routes"


@pytest.fixture(scope="module")
def store() -> Iterator[str]:
    with backends.postgres_database("openhub_hubs") as url:
        upgrade(url)
        yield url


def test_a_second_local_hub_on_the_same_store_submits_duplicates_of_the_first_ones_messages(store: str) -> None:
    with LocalHub(ROUTES, OPENHUB_DATABASE_URL=store) as first:
        ok = first.submit("hops.flow", {})
        first.run()
        assert first.get(ok.id).state == "OK"
    with LocalHub(ROUTES, OPENHUB_DATABASE_URL=store) as second:
        again = second.submit("hops.flow", {"fail_two": True})  # correlation id local-1 again
        second.run()
        assert (again.id, again.duplicate) == (ok.id, True)
        assert second.get(again.id).state == "OK"  # "a failing step ran as succeeding": it never ran


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_local_hub_on_the_same_store_fails_a_failing_step_and_leaves_a_paused_route_alone(
    store: str, n: int
) -> None:
    with LocalHub(ROUTES, OPENHUB_DATABASE_URL=store) as hub:
        failing = hub.submit("hops.flow", {"fail_two": True}, correlation_id=f"hub{n}-failing")
        hub.run()
        assert hub.get(failing.id).state == "PARTLY_FAILED"
        pause("hops.flow", hub=hub.hub)
        try:
            held = hub.submit("hops.flow", {}, correlation_id=f"hub{n}-paused")
            hub.run()
            assert hub.get(held.id).state == "POSTPONED"
        finally:
            resume("hops.flow", hub=hub.hub)
