"""openhub.testing.LocalHub: routes tested in-process, time passed in, no broker."""

from __future__ import annotations

import pytest

from openhub.testing import ExternalSystem, LocalHub


@pytest.fixture
def external():
    system = ExternalSystem().start()
    yield system
    system.stop()


def test_local_hub_runs_a_route_and_retries_in_simulated_time(external, monkeypatch) -> None:
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    external.fail("/local/b", times=1)
    with LocalHub("tests.support.routes", OPENHUB_RETRY_INTERVAL="60") as hub:
        view = hub.submit("test.flow", {"prefix": "/local"})
        assert hub.run() == 1
        assert hub.get(view.id).state == "PARTLY_FAILED"
        assert hub.tick(seconds=30).redriven == 0  # not due yet
        assert hub.tick(seconds=61).redriven == 1  # a minute later the poller re-drives it
        done = hub.get(view.id)
        assert done.state == "OK" and done.failed_count == 1
    assert external.count("/local/a") == 1 and external.count("/local/b") == 2


def test_tick_seconds_count_from_now_not_from_the_last_tick(external, monkeypatch) -> None:
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


def test_local_hub_splits_and_waits(external, monkeypatch) -> None:
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", external.url)
    with LocalHub("tests.support.routes") as hub:
        order = hub.submit("test.order", {"prefix": "/lh", "lines": [{"sku": 1}, {"sku": 2}]})
        hub.run()
        assert hub.get(order.id).state == "OK"
        assert external.effects("/lh/line") == 2 and external.effects("/lh/after") == 1


def test_children_in_their_parents_funnel_are_not_blocked_by_it(external, monkeypatch) -> None:
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
        view = _interrupted_run(hub)
        assert hub.get(view.id).state == "PROCESSING"
        assert hub.tick().repaired == 1
        done = hub.get(view.id)
        assert done.state == "OK" and done.failed_count == 0  # a run lost is no failure of the message's
        assert routes.calls("first") == 1 and routes.calls("second") == 1


def test_two_hubs_side_by_side_each_carry_their_messages_in_their_own_store() -> None:
    """Issue 35, "one way in": a hub owns its settings, routes and database, so two LocalHubs with different
    settings and stores open in one process each carry a message (and a split family, and its
    confirmation) to OK in their own store. The second one opened is the process's installed hub while
    the first is driven: whatever read the process's globals instead of the hub it was given would write
    into the second's store, or take its settings (the stock webhook signed the first's notifications with the
    second's OPENHUB_WEBHOOK_SECRET)."""
    from sqlalchemy import select

    from openhub.core.errors import WebhookSignatureError
    from openhub.outbound.notify import verify_signature
    from openhub.service.reads import list_messages
    from openhub.store.schema import confirmations
    from tests.integration.test_signed_webhooks import PLAIN, SECRET, Receiver
    from tests.support import promise_routes as routes

    def hooked(receiver: Receiver, secret: str) -> dict[str, str]:
        """The stock webhook on `receiver`, told of every OK message, signing with `secret`."""
        return {"OPENHUB_WEBHOOK_URL": receiver.url, "OPENHUB_WEBHOOK_STATES": "OK", "OPENHUB_WEBHOOK_SECRET": secret}

    routes.reset()
    receivers = Receiver(), Receiver()
    with (
        LocalHub(
            routes.__name__, source_system="CONFIRMED", OPENHUB_DEFAULT_PRIORITY="2", **hooked(receivers[0], SECRET)
        ) as one,
        LocalHub(
            routes.__name__, source_system="CONFIRMED", OPENHUB_DEFAULT_PRIORITY="7", **hooked(receivers[1], PLAIN)
        ) as two,
    ):
        assert one.hub is not None and two.hub is not None
        assert one.hub.settings.database_url != two.hub.settings.database_url
        flow = one.submit("p.flow", {}, correlation_id="same-id")
        family = one.submit("p.big", {"children": 2}, correlation_id="family")
        other = two.submit("p.flow", {}, correlation_id="same-id")
        assert not other.duplicate  # the same ids in another hub's store are another message
        one.lose_broker()  # the first hub's chains are lost: its own poller publishes them again, and runs them
        assert one.tick(seconds=3600).redriven == 2
        assert one.tick(seconds=3600).redriven == 0
        assert two.run() == 1

        def stored(local: LocalHub) -> dict[str, tuple[str, int]]:
            return {m.correlation_id: (m.state, m.priority) for m in list_messages(hub=local.hub)}

        assert stored(one) == {
            "same-id": ("OK", 2),
            "family": ("OK", 2),
            "family#0.1": ("OK", 2),
            "family#0.2": ("OK", 2),
        }
        assert stored(two) == {"same-id": ("OK", 7)}
        assert one.get(flow.id).state == one.get(family.id).state == "OK"

        def confirmed(local: LocalHub) -> list[tuple[int, str]]:
            """Its route confirmations, once every confirmation was sent: a tick sends due ones for at most one
            poll interval (openhub.engine.poller.confirm_due), so on a slow box those left over go at the next."""
            assert local.hub is not None
            for _ in range(10):
                with local.hub.transaction() as conn:
                    C = confirmations.c
                    if not conn.execute(select(C.id).where(C.state == "PENDING")).first():
                        break
                local.tick(seconds=3600)
            with local.hub.transaction() as conn:
                C = confirmations.c
                rows = conn.execute(select(C.message_id, C.state).where(C.hook.is_(None))).all()  # not hooks
            return sorted((r.message_id, r.state) for r in rows)

        assert confirmed(one) == [(flow.id, "OK"), (family.id, "OK")]  # the children are not confirmed
        assert confirmed(two) == [(other.id, "OK")]
    for receiver in receivers:
        receiver.close()
    # Each hub's webhook told its own receiver of its own OK messages, signed with its own secret only.
    for receiver, own, theirs, count in ((receivers[0], SECRET, PLAIN, 4), (receivers[1], PLAIN, SECRET, 1)):
        assert len(receiver.posts) == count
        for post in receiver.posts:
            verify_signature(own, post.headers, post.body)
            with pytest.raises(WebhookSignatureError):
                verify_signature(theirs, post.headers, post.body)


def test_two_hubs_record_their_http_steps_exchanges_each_in_its_own_store(external, monkeypatch) -> None:
    """Issue 35: an HTTP step's exchange is recorded from its StepContext, which carries the settings of the hub
    running the step: into that hub's store, cut as that hub's OPENHUB_HTTP_RECORD_BYTES says. The second hub
    opened is the process's installed one: a recording that read the process's settings would land in its
    store, or be cut to its limit."""
    from sqlalchemy import select

    from openhub.store.schema import http_exchanges

    monkeypatch.setenv("OPENHUB_TEST_HTTP_URL", external.url)
    with (
        LocalHub("tests.support.http_routes", OPENHUB_HTTP_RECORD_BYTES="8") as one,
        LocalHub("tests.support.http_routes", OPENHUB_HTTP_RECORD_BYTES="4096") as two,
    ):
        assert one.hub is not None and two.hub is not None
        first = one.submit("http.call", {"path": "/one"})
        second = two.submit("http.call", {"path": "/two"})
        assert one.run() == 1 and two.run() == 1
        assert one.get(first.id).state == two.get(second.id).state == "OK"

        def recorded(local: LocalHub) -> list[tuple[int, str, str]]:
            """Every exchange in the hub's store: its message, the path called, the request body as kept."""
            assert local.hub is not None
            X = http_exchanges.c
            with local.hub.transaction() as conn:
                rows = conn.execute(select(X.message_id, X.url, X.request_body).order_by(X.id)).all()
            return [(r.message_id, r.url.removeprefix(external.url), r.request_body) for r in rows]

        assert recorded(one) == [(first.id, "/one", '{"path":' + "… [7 more bytes not recorded]")]
        assert recorded(two) == [(second.id, "/two", '{"path":"/two"}')]


def test_a_crashed_task_is_noted_in_the_store_its_caller_names() -> None:
    """Issue 35: `record_crash` (the chain-failed task's) writes to the store it is given, not the process's:
    with two hubs open, the first's message gets the note and the second's store (the installed hub's,
    holding a message of the same id) none."""
    from sqlalchemy import select

    from openhub.store.queries import record_crash
    from openhub.store.schema import transitions

    with LocalHub("tests.support.routes") as one, LocalHub("tests.support.routes") as two:
        assert one.hub is not None and two.hub is not None
        view = one.submit("test.flow", {"prefix": "/a"})
        assert two.submit("test.flow", {"prefix": "/b"}).id == view.id  # each store counts from 1

        record_crash(one.hub.settings.database_url, view.id, "step task: RuntimeError('boom')")

        def notes(local: LocalHub) -> list[tuple[str, str | None]]:
            assert local.hub is not None
            T = transitions.c
            with local.hub.transaction() as conn:
                rows = conn.execute(select(T.event, T.detail).where(T.event == "task_crashed")).all()
            return [(r.event, r.detail) for r in rows]

        assert notes(one) == [("task_crashed", "step task: RuntimeError('boom')")]
        assert notes(two) == []


def test_hubs_closed_in_any_order_leave_no_closed_hub_as_the_process_s() -> None:
    """Issue 35: the process's hub is the newest one a driver installed whose block is still open. Each
    LocalHub restored the hub installed before it when it closed: the first closed while the second was open
    made the environment's the process's hub under the second, and the second, closed after, left the first
    (its store deleted) the process's hub for good, its settings what every later `get_settings()` answered."""
    from openhub.core.config import get_settings
    from openhub.core.registry import get_registry
    from openhub.engine.hub import current

    before = get_settings().database_url
    one = LocalHub("tests.support.routes", OPENHUB_DEFAULT_PRIORITY="2").__enter__()
    try:
        two = LocalHub("tests.support.routes", OPENHUB_DEFAULT_PRIORITY="7").__enter__()
    except BaseException:
        one.__exit__(None, None, None)
        raise
    try:
        assert current() is two.hub
        one.__exit__(None, None, None)  # the first closed while the second is still open
        assert current() is two.hub
        assert two.hub is not None and get_settings() is two.hub.settings and get_registry() is two.hub.registry
        view = two.submit("test.flow", {"prefix": "/order"})
        assert two.get(view.id).priority == 7
    finally:
        two.__exit__(None, None, None)
    assert current().settings.database_url == get_settings().database_url == before  # neither hub's
    assert one.hub is not None and current() is not one.hub and get_registry() is not one.hub.registry


def test_a_crashed_run_of_the_first_of_two_hubs_is_repaired_in_its_own_store() -> None:
    """Issue 35: a LocalHub whose run crashed writes its heartbeat row again, leaving the run out, so that the
    next tick repairs it. Written to the process's database (the second hub's, installed last), the first's
    row still vouched for the run and its tick never repaired it."""
    from tests.support import promise_routes as routes

    with routes.local_hub() as one, LocalHub("tests.support.routes"):
        view = _interrupted_run(one)
        assert one.tick().repaired == 1
        assert one.get(view.id).state == "OK"


def test_each_of_two_hubs_judges_heartbeats_by_its_own_worker_dead_after() -> None:
    """Issue 35: a hub's poller judges a process dead by that hub's OPENHUB_WORKER_DEAD_AFTER (its store's
    heartbeats, its limit). It read the process's (the second hub's, installed last): a process silent for
    a minute in the first's store, whose limit is 30 s, was alive by the second's hour."""
    from datetime import timedelta

    from openhub.store.db import utcnow
    from openhub.store.workers import beat

    with (
        LocalHub("tests.support.routes", OPENHUB_WORKER_DEAD_AFTER="30") as one,
        LocalHub("tests.support.routes", OPENHUB_WORKER_DEAD_AFTER="3600") as two,
    ):
        assert one.hub is not None and two.hub is not None
        url, then = one.hub.settings.database_url, utcnow() - timedelta(seconds=120)
        beat("silent", "host-a:1", url, broken=True, now=then)
        beat("witness", "host-b:1", url, broken=True, now=then)
        beat("witness", "host-b:1", url, now=then + timedelta(seconds=60))  # it saw the other silent for 60 s
        assert one.tick().dead_workers == {"silent"}
        assert two.tick().dead_workers == set()


def test_a_hub_s_worker_states_and_crash_notes_read_no_process_settings(monkeypatch) -> None:
    """Issue 35: the worker-states service and the chain-failed task's note took their time from the process's
    database clock (`store_now()` with no URL, when there was one: the installed hub's store, on PostgreSQL
    another server's clock) while writing to the hub's store. Here the process's settings cannot be read at all."""
    from openhub.service import worker_states as states
    from openhub.store.queries import record_crash
    from tests.support.process_store import forbid_process_settings

    with LocalHub("tests.support.routes") as local:
        assert local.hub is not None
        view = local.submit("test.flow", {"prefix": "/states"})
        forbid_process_settings(monkeypatch)
        assert states.worker_states(hub=local.hub) == []  # no worker's main process: LocalHub's row is none
        states.finish_host("host-x", "a test", hub=local.hub)
        assert [h["host"] for h in states.held_hosts(hub=local.hub)] == ["host-x"]
        record_crash(local.hub.settings.database_url, view.id, "step task: RuntimeError('boom')")
        monkeypatch.undo()


def _interrupted_run(hub: LocalHub):
    """A p.flow message whose first step's run `hub` began and Ctrl-C ended (a BaseException out of the step)."""
    from tests.support import promise_routes as routes

    def interrupt(_ctx: object) -> None:
        del routes.HOOKS["first"]
        raise KeyboardInterrupt

    routes.HOOKS["first"] = interrupt
    view = hub.submit("p.flow", {})
    with pytest.raises(KeyboardInterrupt):
        hub.run()
    return view
