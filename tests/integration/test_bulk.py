"""Bulk restart and cancel by filter (issue 13, part 5), and the search by process id, on LocalHub."""

from __future__ import annotations

from typing import Iterator

import pytest

import openhub
from openhub.core.errors import InputError
from openhub.testing import LocalHub
from tests.support import promise_routes as routes


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub() as local:
        yield local


def test_restart_matching_restarts_the_failures_of_one_kind_only(hub: LocalHub) -> None:
    out = [hub.submit("p.reserve", {"raise": "out_of_stock"}).id for _ in range(3)]
    other = hub.submit("p.reserve", {"raise": "bug"}).id  # fails too, with another error code
    hub.run()
    codes = {openhub.get_message(i).error_code for i in out}
    assert len(codes) == 1 and openhub.get_message(other).state == "PARTLY_FAILED"
    code = codes.pop()
    result = openhub.restart_matching(error_code=code, state="FAILED", limit=2)
    assert result.done == out[:2] and result.refused == {} and result.more
    assert openhub.get_message(out[2]).state == "FAILED"
    assert openhub.restart_matching(error_code=code, state="FAILED").done == [out[2]]
    assert {openhub.get_message(i).state for i in out} == {"IN_QUEUE"}


def test_cancel_matching_stops_the_chains_of_one_process_and_confirms_them(hub: LocalHub) -> None:
    mine = [hub.submit("p.flow", {}, process_id="order-7").id for _ in range(2)]
    theirs = hub.submit("p.flow", {}, process_id="order-8").id
    assert [v.id for v in openhub.list_messages(process_id="order-7")] == mine[::-1]
    result = openhub.cancel_matching(process_id="order-7")
    assert result.done == mine and not result.more
    hub.run()
    assert [openhub.get_message(i).state for i in mine] == ["CANCEL", "CANCEL"]
    assert openhub.get_message(theirs).state == "OK"
    assert routes.calls("first") == 1  # only the other process's message called out
    hub.tick()
    assert sorted(routes.CONFIRMED) == sorted([(mine[0], "CANCEL"), (mine[1], "CANCEL"), (theirs, "OK")])


def test_a_bulk_action_without_a_filter_or_for_a_state_it_cannot_change_is_refused(hub: LocalHub) -> None:
    hub.submit("p.flow", {})
    with pytest.raises(InputError, match="at least one filter"):
        openhub.cancel_matching()
    with pytest.raises(InputError, match="not PROCESSING"):
        openhub.restart_matching(state="PROCESSING")
    with pytest.raises(InputError, match="limit"):
        openhub.cancel_matching(service="p", limit=0)
    assert openhub.list_messages(service="p")[0].state == "NEW"
