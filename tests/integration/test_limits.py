"""Calls in flight and calls per second per external system (issue 13, part 3) on LocalHub: with
OPENHUB_SYSTEM_LIMITS a step waits (postponed, no failure) while its system has as many calls in
flight as it allows; with OPENHUB_SYSTEM_RATES until its system's next call is due."""

from __future__ import annotations

from datetime import timedelta
from typing import Iterator

import pytest

from openhub.core.config import get_settings, reset_settings
from openhub.core.errors import ConfigurationError
from openhub.store.db import utcnow
from openhub.store.schema import ext_calls, system_slots
from openhub.store.workers import beat, current_id
from openhub.testing import LocalHub
from tests.support import promise_routes as routes
from tests.support.process_store import process_url, transaction


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub(
        OPENHUB_SYSTEM_LIMITS="post=1", OPENHUB_POSTPONE_INTERVAL="5", OPENHUB_SYSTEM_RATES="paced=2/60"
    ) as local:
        yield local


def test_a_second_call_waits_while_the_system_has_its_one_call_in_flight(hub: LocalHub) -> None:
    second = []

    def start_another_meanwhile(ctx):
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


def test_a_system_paced_at_two_calls_a_minute_makes_the_third_wait(hub: LocalHub) -> None:
    ids = [hub.submit("p.paced", {}).id for _ in range(4)]
    hub.run()  # the bucket starts full: two calls now
    assert [(hub.get(i).state, hub.get(i).failed_count) for i in ids] == [("OK", 0)] * 2 + [("POSTPONED", 0)] * 2
    hub.tick(seconds=10)  # not due yet: nothing called
    assert routes.calls("paced") == 2
    hub.tick(seconds=31)  # one token back after 30 s
    assert routes.calls("paced") == 3 and hub.get(ids[3]).state == "POSTPONED"
    hub.tick(seconds=62)
    assert [hub.get(i).state for i in ids] == ["OK"] * 4 and routes.calls("paced") == 4


@pytest.mark.parametrize(
    "name, bad",
    [
        ("OPENHUB_SYSTEM_LIMITS", "post=0"),
        ("OPENHUB_SYSTEM_LIMITS", "post=many"),
        ("OPENHUB_SYSTEM_RATES", "paced=10"),
        ("OPENHUB_SYSTEM_RATES", "paced=1/0"),
    ],
)
def test_a_limit_must_be_positive(monkeypatch, name: str, bad: str) -> None:
    monkeypatch.setenv(name, bad)
    reset_settings()
    with pytest.raises(ConfigurationError, match=name):
        get_settings()
    monkeypatch.undo()
    reset_settings()


def test_a_dead_workers_slot_is_free_as_soon_as_its_death_is_seen(hub: LocalHub) -> None:
    def killed(ctx):
        if not routes.MOST.get("killed"):
            routes.MOST["killed"] = 1
            raise KeyboardInterrupt  # the process dies mid-call: no outcome, its slot still taken

    routes.HOOKS["post"] = killed
    view = hub.submit("p.limited", {})
    with pytest.raises(KeyboardInterrupt):
        hub.run()
    now = utcnow()
    beat(current_id(), "victim", process_url(), now=now - timedelta(minutes=1))  # silent for a minute...
    beat("witness", "other", process_url(), broken=True, now=now - timedelta(minutes=2))
    beat("witness", "other", process_url(), now=now)  # ...while another worker went on beating
    hub.tick()  # repaired at once, and re-run: the slot must not wait for its 10-minute lease
    assert hub.get(view.id).state == "OK", hub.get(view.id)
    assert routes.calls("post") == 1


def test_a_transaction_that_read_the_clock_earlier_never_winds_the_bucket_back(hub: LocalHub) -> None:
    from openhub.outbound import limits

    start = utcnow()
    rate = (2, 60.0)  # a token every 30 s, two in the bucket
    with transaction() as conn:
        assert limits.paced(conn, "wound", rate, start) is None  # created full: one token left
    with transaction() as conn:
        assert limits.paced(conn, "wound", rate, start + timedelta(seconds=31)) is None  # 1 + 1.03 -> 1.03 left
    # A worker that read its clock before that commit, and committed after it.
    with transaction() as conn:
        assert limits.paced(conn, "wound", rate, start + timedelta(seconds=1)) is None  # 1.03 -> 0.03 left
    # 0.03 tokens at 31 s: the next is due at about 60 s, not granted at 32 s as if 31 s had passed since 1 s.
    with transaction() as conn:
        due = limits.paced(conn, "wound", rate, start + timedelta(seconds=32))
    assert due is not None and due >= start + timedelta(seconds=59), due


def test_a_first_burst_on_postgresql_takes_no_more_tokens_than_the_bucket_holds(local_store: str) -> None:
    """Three steps meet a paced system (2 calls a second) whose bucket does not exist yet: the first
    makes it and holds it uncommitted while the other two find none and wait on its row. With
    psycopg an INSERT's rowcount is -1 whether it inserted or not, and all three took a token."""
    import threading

    from openhub.outbound.limits import paced

    system = f"burst-{utcnow().timestamp()}"
    answers: list[object] = []
    with transaction(local_store) as first:
        assert paced(first, system, (2, 1.0), utcnow()) is None

        def other() -> None:
            with transaction(local_store) as conn:
                answers.append(paced(conn, system, (2, 1.0), utcnow()))

        others = [threading.Thread(target=other) for _ in range(2)]
        for t in others:
            t.start()
        with transaction(local_store) as probe:  # both wait on the first one's uncommitted row

            def waiting() -> bool:
                return probe.exec_driver_sql("SELECT count(*) FROM pg_locks WHERE NOT granted").scalar_one() >= 2

            deadline = utcnow() + timedelta(seconds=20)
            while not waiting() and utcnow() < deadline:
                threading.Event().wait(0.02)  # polling interval of the wait
    for t in others:
        t.join(20)
    assert sorted(a is None for a in answers) == [False, True], answers  # one token left for two steps
