"""openhub.testing.LocalHub: routes tested in-process, time passed in, no broker."""

from __future__ import annotations

import pytest

from openhub.testing import ExternalSystem, LocalHub


@pytest.fixture
def external():  # noqa: ANN201
    system = ExternalSystem().start()
    yield system
    system.stop()


def test_local_hub_runs_a_route_and_retries_in_simulated_time(external, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    external.fail("/local/b", times=1)
    with LocalHub("tests.support.routes", OPENHUB_RETRY_INTERVAL="60") as hub:
        view = hub.submit("test.flow", {"prefix": "/local"})
        assert hub.run() == 1
        assert hub.get(view.id).state == "PARTLY_FAILED"
        assert hub.tick(seconds=30).redriven == 0      # not due yet
        assert hub.tick(seconds=61).redriven == 1      # a minute later the poller re-drives it
        done = hub.get(view.id)
        assert done.state == "OK" and done.failed_count == 1
    assert external.count("/local/a") == 1 and external.count("/local/b") == 2


def test_tick_seconds_count_from_now_not_from_the_last_tick(external, monkeypatch) -> None:  # noqa: ANN001
    # Issue 40: `tick(seconds=N)` read as cumulative surprised; it is N seconds from now, as documented.
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    external.fail("/ticks/b", times=1)
    with LocalHub("tests.support.routes", OPENHUB_RETRY_INTERVAL="60") as hub:
        view = hub.submit("test.flow", {"prefix": "/ticks"})
        hub.run()
        assert hub.tick(seconds=31).redriven == 0
        assert hub.tick(seconds=31).redriven == 0  # 31 s from now again, not 62 s
        assert hub.tick(seconds=61).redriven == 1
        assert hub.get(view.id).state == "OK"


def test_local_hub_splits_and_waits(external, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    with LocalHub("tests.support.routes") as hub:
        order = hub.submit("test.order", {"prefix": "/lh", "lines": [{"sku": 1}, {"sku": 2}]})
        hub.run()
        assert hub.get(order.id).state == "OK"
        assert external.effects("/lh/line") == 2 and external.effects("/lh/after") == 1


def test_children_in_their_parents_funnel_are_not_blocked_by_it(external, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    with LocalHub("tests.support.routes") as hub:
        parent = hub.submit("test.funnelled_split", {"prefix": "/fam", "group": "g"})
        hub.run()
        for _ in range(4):  # the children take turns in the funnel, re-driven by the poller
            hub.tick(seconds=60)
        assert hub.get(parent.id).state == "OK"
    assert external.effects("/fam/ordered") == 2


def test_a_run_that_crashed_mid_step_is_repaired_by_the_next_tick() -> None:
    # A BaseException out of a step (Ctrl-C while a test runs it) left its run leased as long as the hub
    # was open: the hub's heartbeat row, written when it opened, vouched for every run begun after it,
    # so no tick repaired the run and the message was never carried on.
    from tests.support import promise_routes as routes

    with routes.local_hub() as hub:
        def interrupt(_ctx: object) -> None:
            del routes.HOOKS["first"]
            raise KeyboardInterrupt

        routes.HOOKS["first"] = interrupt
        view = hub.submit("p.flow", {})
        with pytest.raises(KeyboardInterrupt):
            hub.run()
        assert hub.get(view.id).state == "PROCESSING"
        assert hub.tick().repaired == 1
        done = hub.get(view.id)
        assert done.state == "OK" and done.failed_count == 0  # a run lost is no failure of the message's
        assert routes.calls("first") == 1 and routes.calls("second") == 1
