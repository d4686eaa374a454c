"""Calls in flight per external system (issue 13, part 3) on LocalHub: with OPENHUB_SYSTEM_LIMITS
a step waits (postponed, no failure) while its system has as many calls in flight as it allows."""

from __future__ import annotations

from typing import Iterator

import pytest

from openhub.db import transaction
from openhub.errors import ConfigurationError
from openhub.config import reset_settings, get_settings
from openhub.schema import ext_calls, system_slots
from openhub.testing import LocalHub
from tests.support import promise_routes as routes


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    routes.reset()
    with LocalHub("tests.support.promise_routes", source_system="CONFIRMED", OPENHUB_SYSTEM_LIMITS="post=1",
                  OPENHUB_POSTPONE_INTERVAL="5") as local:
        yield local
    routes.reset()


def test_a_second_call_waits_while_the_system_has_its_one_call_in_flight(hub: LocalHub) -> None:
    second = []

    def start_another_meanwhile(ctx):  # noqa: ANN001, ANN202
        if not second:
            second.append(hub.submit("p.limited", {}, correlation_id="second").id)
            hub.run()  # its chain runs now, while this call is in flight

    routes.HOOKS["post"] = start_another_meanwhile
    first = hub.submit("p.limited", {}, correlation_id="first")
    hub.run()
    assert routes.MOST["post"] == 1, "two calls were in flight at once"
    waiting = hub.get(second[0])
    assert (waiting.state, waiting.failed_count) == ("POSTPONED", 0)
    with transaction() as conn:  # the waiting step made no call, so it keeps no record of one
        assert conn.execute(ext_calls.select().where(ext_calls.c.message_id == waiting.id)).all() == []
        assert [r.step_run for r in conn.execute(system_slots.select())] == [None]  # given back
    assert hub.get(first.id).state == "OK"
    hub.tick(seconds=6)
    assert hub.get(second[0]).state == "OK" and routes.calls("post") == 2


def test_a_limit_must_be_a_positive_whole_number(monkeypatch) -> None:  # noqa: ANN001
    for bad in ("post=0", "post=many"):
        monkeypatch.setenv("OPENHUB_SYSTEM_LIMITS", bad)
        reset_settings()
        with pytest.raises(ConfigurationError, match="OPENHUB_SYSTEM_LIMITS"):
            get_settings()
    reset_settings()
