"""The promise on every path (issue 9): no successful external call made twice, no message stuck or
wrongly failed. Each test reproduces one path that broke it, in-process on LocalHub, with the
fault placed exactly where it hurt: in the middle of a step's call, or right after it.
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import event, select

import openhub
from openhub.core.errors import StoreUnavailable
from openhub.engine import batch, engine, entry, lifecycle, poller
from openhub.engine.hub import Hub, current
from openhub.store.db import utcnow
from openhub.store.schema import ext_calls, messages, transitions
from openhub.store.workers import beat, current_id
from openhub.testing import LocalHub
from tests.support import promise_routes as routes
from tests.support.backends import postgres_database
from tests.support.process_store import get_engine, process_url, transaction

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub(local_store_env: dict[str, str]) -> Iterator[LocalHub]:
    with routes.local_hub(
        OPENHUB_RETRY_INTERVAL="60", OPENHUB_LEASE_GRACE="300", OPENHUB_MAX_FAILS="3", **local_store_env
    ) as local:
        yield local


def _history(message_id: int) -> list[str]:
    with transaction() as conn:
        return list(
            conn.execute(
                select(transitions.c.event).where(transitions.c.message_id == message_id).order_by(transitions.c.id)
            ).scalars()
        )


def _calls_of(message_id: int) -> dict[str, tuple[str, int | None]]:
    with transaction() as conn:
        return {
            r.step_key: (r.state, r.ok_message_id)
            for r in conn.execute(select(ext_calls).where(ext_calls.c.message_id == message_id))
        }


# --- 1. an error while recording a successful step -------------------------------------------------


def test_custom_data_that_is_not_json_keeps_the_call_and_fails_the_message_once(hub: LocalHub) -> None:
    view = hub.submit("p.stamp", {})
    hub.run()
    for minutes in (10, 20, 30):
        hub.tick(seconds=minutes * 60)
    done = hub.get(view.id)
    assert routes.calls("stamp") == 1
    assert done.state == "FAILED" and "custom_data" in (done.failed_error or "")
    assert _calls_of(view.id)["stamp"] == ("OK", view.id)
    assert routes.CONFIRMED == [(view.id, "FAILED")]


def test_a_failing_follow_up_while_recording_never_repeats_the_call(hub: LocalHub, monkeypatch) -> None:
    real = lifecycle.queue_confirmation
    failures = []

    def fails_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise RuntimeError("confirmation queue broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "queue_confirmation", fails_once)
    view = hub.submit("p.flow", {})
    hub.run()
    assert hub.get(view.id).state == "PARTLY_FAILED"
    hub.tick(seconds=120)
    assert hub.get(view.id).state == "OK"
    assert routes.calls("first") == 1 and routes.calls("second") == 1


# --- 2. the store away right after a call, longer than any fixed number of retries -------------------


@pytest.mark.parametrize("route", ["p.flow", "p.fused", "p.batch"])
def test_an_outage_after_the_call_is_waited_out_not_repaired_by_calling_again(
    route: str, hub: LocalHub, monkeypatch
) -> None:
    from openhub.engine import hub as hubs  # where the hub's transactions begin (`Hub.transaction`)

    real = hubs.transaction
    outage = {"left": 0}

    def away(*args, **kwargs):
        if outage["left"]:
            outage["left"] -= 1
            raise StoreUnavailable("message store unavailable: connection refused")
        return real(*args, **kwargs)

    monkeypatch.setattr(hubs, "transaction", away)
    for module in (engine, batch):  # a batch route's group transactions are batch's
        monkeypatch.setattr(module, "pause_before_retry", lambda seconds: None)
    routes.HOOKS["first"] = lambda ctx: outage.update(left=100)  # far more tries than the old limit of 12
    views = [hub.submit(route, {}) for _ in range(3)]  # one batch of p.batch
    hub.run()
    assert outage["left"] == 0
    assert [hub.get(v.id).state for v in views] == ["OK"] * 3
    assert routes.calls("first") == 3


def test_the_store_away_right_before_a_later_batch_members_call_is_waited_out(hub: LocalHub, monkeypatch) -> None:
    """Issue 33, the fence: under prefork a batch member's lease is read right before its call, after the
    earlier members' calls. The store away at that read is waited out, as the group's writes wait for it:
    each member's call is made once, after the store is back, and nothing is left to the repair."""
    from openhub.engine import hub as hubs  # where a hub's reading transactions begin (`Hub.reading`)

    real = hubs.reading
    outage = {"left": 0, "cuts": 0}

    def away(*args, **kwargs):
        if outage["left"]:
            outage["left"] -= 1
            raise StoreUnavailable("message store unavailable: connection refused")
        return real(*args, **kwargs)

    def cut(ctx) -> None:
        outage["cuts"] += 1
        outage["left"] = 30

    monkeypatch.setattr(hubs, "reading", away)
    monkeypatch.setattr(batch, "pause_before_retry", lambda seconds: None)
    routes.HOOKS["first"] = routes.HOOKS["second"] = cut
    views = [hub.submit("p.batch", {}, source_system="UNCONFIRMED") for _ in range(3)]  # one batch
    hub.run()
    assert outage["cuts"] == 6 and outage["left"] == 30  # the last member's call left its outage unread
    assert [hub.get(v.id).state for v in views] == ["OK"] * 3
    assert routes.calls("first") == 3 and routes.calls("second") == 3
    assert all(_history(v.id) == ["accepted", "claimed", "step_ok", "step_ok", "completed"] for v in views)


def test_a_batch_enters_and_records_each_step_of_all_its_messages_in_one_commit(hub: LocalHub) -> None:
    commits = []

    def count(conn) -> None:
        commits.append(conn)

    views = [hub.submit("p.batch", {}, source_system="UNCONFIRMED") for _ in range(3)]
    event.listen(get_engine(), "commit", count)
    try:
        hub.run()
    finally:
        event.remove(get_engine(), "commit", count)
    assert [hub.get(v.id).state for v in views] == ["OK"] * 3
    assert len(commits) == 3  # claim and enter all three; record first and enter second; record second
    assert all(_history(v.id) == ["accepted", "claimed", "step_ok", "step_ok", "completed"] for v in views)


def _in_autocommit(conn) -> bool:
    """Whether `conn` runs its statements in autocommit (`store.db.single_statement` on PostgreSQL: each one
    its own transaction, with no COMMIT that the "commit" event would see)."""
    return bool(getattr(conn.connection.dbapi_connection, "autocommit", False))


def _count_transactions(engine, counted: dict[str, int]):
    """Listeners counting, into `counted`, the statements and the transactions: commits, and statements
    run in autocommit."""

    def statement(conn, *_args) -> None:
        counted["statements"] += 1
        if _in_autocommit(conn):
            counted["commits"] += 1

    def commit(_conn) -> None:
        counted["commits"] += 1

    return [(engine, "before_cursor_execute", statement), (engine, "commit", commit)]


def test_a_fused_task_hands_each_lease_on_in_the_commit_that_records_the_step(hub: LocalHub) -> None:
    counted = {"statements": 0, "commits": 0}
    view = hub.submit("p.fused", {}, source_system="UNCONFIRMED")  # no confirmation's commits counted
    listeners = _count_transactions(get_engine(), counted)
    for listener in listeners:
        event.listen(*listener)
    try:
        hub.run()
    finally:
        for listener in listeners:
            event.remove(*listener)
    assert hub.get(view.id).state == "OK"
    # claim and enter first; record first and enter second; record second (on PostgreSQL each of the three
    # may be one statement in autocommit: still one transaction each)
    assert counted["commits"] == 3
    assert _history(view.id) == ["accepted", "claimed", "step_ok", "step_ok", "completed"]


# Per message of a 2-step route, on PostgreSQL: its submit (the row, its history entry and the drain
# check), then each a statement that is its own transaction (`store.db.single_statement`, issue 42): the
# claim (pauses, claim, history entry and first call record), the first step's outcome, the second step's
# lease with its call record (chain mode; fused hands the lease on in the outcome's statement), and the
# last step's outcome with the final state. A transaction is a commit or a statement in autocommit.
@pytest.mark.parametrize("route, statements, commits", [("p.flow", 1 + 4, 1 + 4), ("p.fused", 1 + 3, 1 + 3)])
def test_a_message_takes_few_statements_on_postgresql(
    route: str, statements: int, commits: int, hub: LocalHub, monkeypatch
) -> None:
    counted = {"statements": 0, "commits": 0}
    listeners = _count_transactions(get_engine(), counted)
    # Not the message's: the live settings' read (Hub.refresh), at most every half poll interval per process,
    # which would add a statement and a commit to whichever message's run it falls in.
    monkeypatch.setattr(Hub, "refresh", lambda self, force=False: self.settings)
    for listener in listeners:
        event.listen(*listener)
    try:
        view = hub.submit(route, {}, source_system="UNCONFIRMED")  # no confirmation's statements counted
        hub.run()
    finally:
        for listener in listeners:
            event.remove(*listener)
    assert hub.get(view.id).state == "OK"
    assert counted["commits"] == commits
    if get_engine().dialect.name == "postgresql":
        assert counted["statements"] == statements


def test_celerys_soft_time_limit_while_recording_is_waited_out_not_recorded_as_a_failure(
    hub: LocalHub, monkeypatch
) -> None:
    """The engine reads Celery's SoftTimeLimitExceeded as openhub's Interrupted through the task's
    `translate` (tasks/exceptions.py): the step is done, so its outcome is written, not replaced."""
    from celery.exceptions import SoftTimeLimitExceeded

    spec = importlib.util.spec_from_file_location("tasks_exceptions", ROOT / "tasks" / "exceptions.py")
    assert spec is not None and spec.loader is not None
    boundary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boundary)
    from openhub.engine import hub as hubs  # where the hub's transactions begin (`Hub.transaction`)

    limit = {"left": 0}

    def interrupting(real):
        def interrupted(*args, **kwargs):
            if limit["left"]:
                limit["left"] -= 1
                raise SoftTimeLimitExceeded()
            return real(*args, **kwargs)

        return interrupted

    monkeypatch.setattr(hubs, "transaction", interrupting(hubs.transaction))
    # On PostgreSQL a step's outcome may be written in one statement of its own (`Hub.single_statement`).
    monkeypatch.setattr(hubs, "single_statement", interrupting(hubs.single_statement))
    routes.HOOKS["first"] = lambda ctx: limit.update(left=1)
    view = hub.submit("p.flow", {})
    route, message_id, token, _start, _trace, _priority = hub.publisher.chains.popleft()
    report = engine.run_step(route.name, 0, message_id, token, translate=boundary.translate)
    assert limit["left"] == 0 and (report.go_on, report.outcome) == (True, "ok")
    assert engine.run_step(route.name, 1, message_id, token).outcome == "ok"  # the chain's next, last task
    assert hub.get(view.id).state == "OK" and hub.get(view.id).failed_count == 0
    assert routes.calls("first") == 1


def test_a_fault_entering_the_next_step_does_not_undo_the_step_before(hub: LocalHub, monkeypatch) -> None:
    real, failures = entry.prepare, []

    def fails_once_at_the_second_step(tx, run, *args, **kwargs):
        if run.index == 1 and not failures:
            failures.append(run.index)
            raise RuntimeError("a bug in entering the step")
        return real(tx, run, *args, **kwargs)

    monkeypatch.setattr(entry, "prepare", fails_once_at_the_second_step)
    view = hub.submit("p.fused", {})
    hub.run()
    assert failures == [1]  # the hand-over failed, the first step was recorded alone, the second entered anew
    assert hub.get(view.id).state == "OK" and hub.get(view.id).failed_count == 0
    assert routes.calls("first") == 1 and routes.calls("second") == 1
    assert _calls_of(view.id) == {"first": ("OK", view.id), "second": ("OK", view.id)}


# --- 3. an entity record taken over by a newer message whose call failed -------------------------------


def test_an_entity_call_that_succeeded_is_not_made_again_after_a_newer_message_failed_it(hub: LocalHub) -> None:
    now = utcnow()

    def second_fails_for_the_first_message(ctx):
        if ctx.message.correlation_id == "older" and ctx.attempt == 1 and ctx.message.failed_count == 0:
            raise RuntimeError("billing answered 503")

    def sync_fails_for_the_newer_message(ctx):
        if ctx.message.correlation_id == "newer" and ctx.message.failed_count == 0:
            raise RuntimeError("the network operator answered 503")

    routes.HOOKS["second"] = second_fails_for_the_first_message
    routes.HOOKS["sync"] = sync_fails_for_the_newer_message
    older = hub.submit("p.entity", {"id": "42"}, correlation_id="older", msg_timestamp=now - timedelta(minutes=1))
    hub.run()
    assert hub.get(older.id).state == "PARTLY_FAILED"
    newer = hub.submit("p.entity", {"id": "42"}, correlation_id="newer", msg_timestamp=now)
    hub.run()
    assert hub.get(newer.id).state == "PARTLY_FAILED"
    hub.tick(seconds=120)
    older_key = "CONFIRMED/older/sync"
    assert routes.calls("sync", older_key) == 1, routes.CALLS
    assert hub.get(older.id).state in ("OK", "SKIPPED") and hub.get(newer.id).state == "OK"


# --- 4. cancel while a step is calling out -------------------------------------------------------------


@pytest.mark.parametrize("route", ["p.flow", "p.fused"])
def test_a_restart_after_a_cancel_mid_step_waits_for_the_call_in_flight(route: str, hub: LocalHub) -> None:
    def cancel_restart_and_run_again(ctx):
        if ctx.message.failed_count == 0 and not routes.MOST.get("restarted"):
            routes.MOST["restarted"] = 1
            openhub.cancel(ctx.message.id)
            openhub.restart(ctx.message.id)
            hub.run()  # the restarted chain runs now, while this call is still in flight

    routes.HOOKS["first"] = cancel_restart_and_run_again
    view = hub.submit(route, {})
    hub.run()
    assert routes.MOST["first"] == 1, "the step ran a second time while its first call was in flight"
    hub.tick(seconds=60)
    assert hub.get(view.id).state == "OK"
    assert routes.calls("first") == 1 and routes.calls("second") == 1


def test_a_cancelled_message_holds_its_funnel_until_its_call_ends(hub: LocalHub) -> None:
    started: list[int] = []

    def cancel_and_let_the_next_one_try(ctx):
        started.append(ctx.message.id)
        if len(started) == 1:
            openhub.cancel(ctx.message.id)
            hub.submit("p.funnel", {"group": "g"}, correlation_id="next")
            hub.run()  # the next message of the funnel tries to start while this call is in flight
            assert started == [ctx.message.id], "a second message of the funnel called out at the same time"

    routes.HOOKS["first"] = cancel_and_let_the_next_one_try
    cancelled = hub.submit("p.funnel", {"group": "g"}, correlation_id="cancelled")
    hub.run()
    assert routes.MOST["first"] == 1
    hub.tick(seconds=60)
    assert hub.get(cancelled.id).state == "CANCEL"
    assert [v.state for v in openhub.list_messages(correlation_id="next")] == ["OK"]


# --- 8. a message postponed because its funnel is busy does not re-drive itself -----------------------


def test_a_message_behind_a_busy_funnel_waits_quietly(hub: LocalHub) -> None:
    waiting = hub.submit("p.waiting", {"group": "g"})
    hub.run()
    assert hub.get(waiting.id).state == "WAITING_FOR_RES"
    behind = hub.submit("p.waiting", {"group": "g"})
    assert hub.run() <= 2  # its own chain, and no loop of re-drives
    assert hub.get(behind.id).state == "POSTPONED"
    assert len(_history(behind.id)) <= 3


# --- 9. a backlog in the broker is not a lost chain -----------------------------------------------------


def test_a_chain_waiting_in_a_backlog_costs_no_failure(hub: LocalHub) -> None:
    view = hub.submit("p.flow", {})
    published = []
    for minutes in range(5, 125, 5):  # two hours of backlog, the poller looking every five minutes
        report = poller.tick(hub.hub, utcnow() + timedelta(minutes=minutes, seconds=1))
        published.append(report.redriven)
        current = hub.get(view.id)
        assert current.state in ("NEW", "IN_QUEUE") and current.failed_count == 0
    # Published again after 5, 15, 35, 75 minutes...: each wait twice the last, not every grace period.
    assert sum(published) <= 5, published
    hub.run()  # the stale chains stop at their fencing token, the newest carries the message
    assert hub.get(view.id).state == "OK" and hub.get(view.id).failed_count == 0
    assert routes.calls("first") == 1 and routes.calls("second") == 1


@pytest.mark.parametrize("route", ["p.flow", "p.fused"])
def test_a_slow_step_on_a_live_worker_is_never_repaired(route: str, hub: LocalHub) -> None:
    reports = []
    routes.HOOKS["first"] = lambda ctx: reports.append(poller.tick(hub.hub, utcnow() + timedelta(hours=2)))
    view = hub.submit(route, {})
    hub.run()
    assert reports[0].repaired == 0
    assert hub.get(view.id).state == "OK" and hub.get(view.id).failed_count == 0
    assert routes.calls("first") == 1


def test_a_chain_handed_over_by_a_worker_that_died_is_published_again_at_once(hub: LocalHub) -> None:
    view = hub.submit("p.flow", {})
    route, message_id, token, _start, _trace, _priority = hub.publisher.chains.popleft()
    assert engine.run_step(route.name, 0, message_id, token)  # the first step; the worker dies before sending the next
    hub.publisher.chains.clear()
    with transaction() as conn:
        row = conn.execute(select(messages.c.worker, messages.c.step_run).where(messages.c.id == view.id)).one()
    assert row.worker == current_id() and row.step_run is None  # named as the one to send the next step
    now = utcnow()
    beat(current_id(), "victim", process_url(), now=now - timedelta(minutes=1))  # silent for a minute...
    beat("witness", "other", process_url(), broken=True, now=now - timedelta(minutes=2))
    beat("witness", "other", process_url(), now=now)  # ...while another worker went on beating
    hub.tick()  # now: long before the 300 s lease grace would let the chain-lost check see it
    assert (hub.get(view.id).state, hub.get(view.id).failed_count) == ("OK", 0), _history(view.id)
    assert routes.calls("first") == 1 and routes.calls("second") == 1


# --- 10. pausing a guaranteed-order route is not being blocked in its funnel ----------------------------


def test_pausing_a_guaranteed_order_route_does_not_fail_its_messages(hub: LocalHub) -> None:
    openhub.pause("p.ordered")
    ids = [hub.submit("p.ordered", {"group": "g"}).id for _ in range(2)]
    hub.run()
    for minutes in (1, 5, 30):
        hub.tick(seconds=minutes * 60)
    assert [hub.get(i).state for i in ids] == ["POSTPONED", "POSTPONED"]
    openhub.resume("p.ordered")
    hub.run()
    for _ in range(3):
        hub.tick()
    assert [hub.get(i).state for i in ids] == ["OK", "OK"]


# --- 5. the transaction before a call commits durably ---------------------------------------------------


def test_every_store_connection_commits_synchronously_on_postgresql() -> None:
    from openhub.store import db

    routes.reset()
    with postgres_database("openhub_promise") as url:
        with LocalHub("tests.support.promise_routes", OPENHUB_DATABASE_URL=url) as local:
            view = local.submit("p.flow", {})
            local.run()
            assert local.get(view.id).state == "OK"
            settings = set()
            for (_pid, engine_url), engine_ in db._engines.items():
                if engine_url != url:
                    continue  # another test's store (a heartbeat thread it left behind)
                with engine_.connect() as conn:
                    settings.add(conn.exec_driver_sql("SHOW synchronous_commit").scalar())
    assert settings == {"on"}
    routes.reset()


def test_a_restarted_message_starts_its_order_wait_anew(hub: LocalHub) -> None:
    from openhub.store.schema import messages

    routes.HOOKS["first"] = lambda ctx: (
        (_ for _ in ()).throw(openhub.Reject("refused")) if ctx.message.correlation_id == "head" else None
    )
    head = hub.submit("p.ordered", {"group": "g"}, correlation_id="head")
    hub.run()
    behind = hub.submit("p.ordered", {"group": "g"}, correlation_id="behind")
    hub.run()
    assert (hub.get(head.id).state, hub.get(behind.id).state) == ("FAILED", "POSTPONED")
    assert poller.expire_guaranteed_order(hub.hub, utcnow() + timedelta(seconds=10)) == 1  # blocked past the timeout
    assert hub.get(behind.id).state == "FAILED"
    openhub.restart(behind.id)
    with transaction() as conn:
        since = conn.execute(select(messages.c.blocked_since).where(messages.c.id == behind.id)).scalar()
    assert since is None  # its wait behind the funnel starts again when it is next refused


def test_local_hub_ticks_move_the_engines_clock_too(hub: LocalHub) -> None:
    routes.HOOKS["first"] = lambda ctx: (
        (_ for _ in ()).throw(openhub.Reject("refused")) if ctx.message.correlation_id == "head" else None
    )
    hub.submit("p.ordered", {"group": "g"}, correlation_id="head")
    hub.run()
    behind = hub.submit("p.ordered", {"group": "g"}, correlation_id="behind")
    hub.run()
    assert hub.get(behind.id).state == "POSTPONED"
    hub.tick(seconds=10)  # re-driven and refused again ten seconds later: past its 3 s order timeout
    assert hub.get(behind.id).state == "FAILED"
    assert "longer than" in (hub.get(behind.id).failed_error or "")


# --- 6. a slow confirmer: each confirmation's lease covers its own send only -----------------------


def test_a_confirmation_sent_while_the_store_goes_away_is_recorded_not_sent_again(hub: LocalHub, monkeypatch) -> None:
    from openhub.outbound import confirm

    real = confirm.transaction
    outage = {"left": 0}

    def store(*args, **kwargs):
        if outage["left"]:
            outage["left"] -= 1
            raise StoreUnavailable("the database restarts")
        return real(*args, **kwargs)

    monkeypatch.setattr(confirm, "transaction", store)
    monkeypatch.setattr(confirm, "outage_pause", lambda attempt: 0.0)
    routes.HOOKS["confirm"] = lambda outcome: outage.update(left=5)  # goes away right after the CRM answered
    view = hub.submit("p.flow", {})
    hub.run()
    hub.tick(seconds=3600)  # long past the confirmation's lease
    assert routes.CONFIRMED == [(view.id, "OK")]
    assert [c["state"] for c in openhub.list_confirmations(message_id=view.id)] == ["OK"]


def test_a_confirmation_whose_sender_died_mid_send_is_sent_by_the_task_it_is_handed_over_to(hub: LocalHub) -> None:
    """A sender that died while sending leaves its row SENDING; once its lease is over the poller hands the
    row to an `openhub.confirm` task. On main the hand-over marked it HANDED_OVER but left it SENDING, which
    the task did not take (only PENDING or FAILED ones), and each tick a lease later handed it over again:
    the message was never confirmed (issue 33, test_hosts' 'OK, never confirmed', seen five times)."""
    from sqlalchemy import update

    from openhub.core.states import ConfirmationState as CS
    from openhub.outbound.confirm import hand_over_due, send_confirmations
    from openhub.store.schema import confirmations

    routes.HOOKS["confirm"] = lambda outcome: (_ for _ in ()).throw(RuntimeError("CRM is down"))
    view = hub.submit("p.flow", {})
    hub.run()
    assert [c["state"] for c in openhub.list_confirmations(message_id=view.id)] == ["FAILED"]
    del routes.HOOKS["confirm"]
    now = utcnow()
    with transaction() as conn:  # claimed by a sender that died: its lease ran out a second ago
        conn.execute(
            update(confirmations)
            .where(confirmations.c.message_id == view.id)
            .values(state=CS.SENDING, claim="a-dead-senders-claim", due_at=now - timedelta(seconds=1))
        )
    assert hub.hub is not None
    published: list[int] = []
    assert hand_over_due(now, lambda message_id: published.append(message_id) or True, hub.hub.settings) == 1
    assert published == [view.id]
    # What the `openhub.confirm` task does with the message it was handed.
    assert send_confirmations(view.id, settings=hub.hub.settings, registry=hub.hub.registry) == 1
    assert routes.CONFIRMED == [(view.id, "OK")]
    assert [c["state"] for c in openhub.list_confirmations(message_id=view.id)] == ["OK"]


def test_a_slow_confirmer_confirms_each_message_once_with_two_senders(monkeypatch) -> None:
    import time

    from openhub.outbound.confirm import send_confirmations

    routes.reset()
    with LocalHub(
        "tests.support.promise_routes",
        source_system="CONFIRMED",
        OPENHUB_CONFIRM_INTERVAL="1",
        OPENHUB_STEP_TIMEOUT="1",
    ) as local:  # a confirmation's lease: one second
        calls = {"n": 0}
        routes.HOOKS["confirm"] = lambda outcome: (_ for _ in ()).throw(RuntimeError("CRM is down"))
        ids = [local.submit("p.flow", {}).id for _ in range(5)]
        local.run()  # all five OK; each first confirmation fails and waits for the poller

        def slow(outcome) -> None:
            calls["n"] += 1
            time.sleep(0.4)  # the CRM takes 0.4 s per confirmation: this is its behaviour under test
            if calls["n"] == 4:  # 1.2 s in, past a lease taken for the whole batch: a second sender starts
                send_confirmations(now=utcnow(), **parts)

        parts = {"settings": local.hub.settings, "registry": local.hub.registry}
        routes.HOOKS["confirm"] = slow
        from sqlalchemy import update

        from openhub.store.schema import confirmations

        with transaction() as conn:  # their retry is due now
            conn.execute(update(confirmations).values(due_at=utcnow()))
        send_confirmations(now=utcnow(), **parts)
        confirmed = sorted(routes.CONFIRMED)
    routes.reset()
    assert confirmed == sorted((i, "OK") for i in ids)  # each final state confirmed exactly once


# --- 11. a split larger than one statement's parameters -----------------------------------------------


def test_a_split_of_five_thousand_children_and_a_batch_as_large_are_stored_on_postgresql() -> None:
    routes.reset()
    with postgres_database("openhub_promise") as url:
        with LocalHub("tests.support.promise_routes", OPENHUB_DATABASE_URL=url) as local:
            parent = local.submit("p.big", {"children": 5000})
            local.run(limit=1)  # the parent's chain only: it writes its children and waits for them
            assert local.get(parent.id).state == "WAITING"
            assert len(openhub.list_messages(parent_id=parent.id, limit=1000)) == 1000
            views = openhub.submit_many(
                [
                    {"route": "p.leaf", "payload": {}, "source_system": "BULK", "correlation_id": f"b-{n}"}
                    for n in range(5000)
                ]
            )
            assert len({v.id for v in views}) == 5000
            with transaction() as conn:
                from sqlalchemy import func

                from openhub.store.schema import messages

                children = conn.execute(select(func.count()).where(messages.c.parent_id == parent.id)).scalar()
            assert children == 5000
    routes.reset()


# --- 7. split children's ids never collide with a source system's own ---------------------------------


def test_a_source_systems_own_id_that_looks_like_a_childs_does_not_stop_the_split(hub: LocalHub) -> None:
    mine = hub.submit("p.leaf", {}, correlation_id="P#0.1")  # the source system's own id, sent first
    parent = hub.submit("p.big", {"children": 2}, correlation_id="P")
    hub.run()
    assert hub.get(parent.id).state == "OK"
    assert len(openhub.list_messages(parent_id=parent.id)) == 2
    later = hub.submit("p.leaf", {}, correlation_id="P#0.2")  # after the children exist: a new message
    children = [c.id for c in openhub.list_messages(parent_id=parent.id)]
    assert not later.duplicate and later.id not in (mine.id, *children)


def test_a_parent_with_the_longest_id_can_split(hub: LocalHub) -> None:
    parent = hub.submit("p.big", {"children": 12}, correlation_id="x" * 255)
    hub.run()
    assert hub.get(parent.id).state == "OK"
    assert len(openhub.list_messages(parent_id=parent.id)) == 12


# --- minor: a response that comes while an earlier step still runs -------------------------------------


def test_a_response_that_came_while_its_question_was_asked_is_not_waited_for(hub: LocalHub) -> None:
    # The responder answers with the token the question gave, before the question's step has ended.
    routes.HOOKS["waits"] = lambda ctx: openhub.respond(ctx.message.id, {"answer": 42}, token=ctx.wait_token)
    view = hub.submit("p.answered", {})
    hub.run()  # no tick: nothing may wait for the hour-long response timeout
    assert hub.get(view.id).state == "OK", _history(view.id)
    assert routes.calls("waits") == 1 and routes.calls("use_reply") == 1


def test_a_response_for_an_earlier_wait_does_not_answer_a_later_one(hub: LocalHub) -> None:
    view = hub.submit("p.waiting", {"group": "g"})
    hub.run()
    assert hub.get(view.id).state == "WAITING_FOR_RES"
    openhub.respond(view.id, {"answer": 1})
    hub.run()
    assert hub.get(view.id).state == "OK"
    openhub.restart(view.id, total=True)  # the same wait again: the old response does not answer it
    hub.run()
    assert hub.get(view.id).state == "WAITING_FOR_RES"


def test_each_external_call_names_the_process_of_its_last_attempt(hub: LocalHub) -> None:
    from openhub.api.detail import message_detail
    from openhub.store.workers import current_node

    view = hub.submit("p.flow", {})
    hub.run()
    assert {c["worker"] for c in message_detail(current(), view.id)["ext_calls"]} == {current_node()}


def test_a_fault_handing_one_message_of_a_batch_over_falls_back_for_it_alone(hub: LocalHub, monkeypatch) -> None:
    """The group's write fails for the middle message: written again with a savepoint each, its hand-over
    rolls back alone, it is recorded alone and enters its next step anew; the others are handed over."""
    real, failures = entry.prepare, []
    views = [hub.submit("p.batch", {}) for _ in range(3)]

    def fails_twice_for_one(tx, run, *args):
        if run.index == 1 and run.message_id == views[1].id and len(failures) < 2:
            failures.append(run.message_id)
            raise RuntimeError("a bug in entering the step")
        return real(tx, run, *args)

    monkeypatch.setattr(entry, "prepare", fails_twice_for_one)
    hub.run()
    assert len(failures) == 2  # the group's write, then its own savepoint in the careful one
    assert [(hub.get(v.id).state, hub.get(v.id).failed_count) for v in views] == [("OK", 0)] * 3
    assert routes.calls("first") == 3 and routes.calls("second") == 3


def test_a_fault_entering_one_message_of_a_batch_leaves_it_to_the_repair_alone(hub: LocalHub, monkeypatch) -> None:
    real, real_all = entry._claim, batch.claim_all
    views = [hub.submit("p.batch", {}) for _ in range(3)]

    def fails_for_one(tx, row, run, lease):
        if run.message_id == views[1].id:
            raise RuntimeError("a bug in claiming")
        return real(tx, row, run, lease)

    def fails_with_one(tx, runs):  # PostgreSQL's one claim statement for the batch (openhub.engine.batch_claims)
        if any(run.message_id == views[1].id for run, _ in runs):
            raise RuntimeError("a bug in claiming")
        return real_all(tx, runs)

    monkeypatch.setattr(entry, "_claim", fails_for_one)
    monkeypatch.setattr(batch, "claim_all", fails_with_one)
    hub.run()
    assert [hub.get(v.id).state for v in views] == ["OK", "NEW", "OK"]  # nothing of its entry written
    monkeypatch.setattr(entry, "_claim", real)
    hub.tick(seconds=600)  # its chain is overdue: the poller publishes it again
    assert [hub.get(v.id).state for v in views] == ["OK"] * 3
    assert routes.calls("first") == 3 and routes.calls("second") == 3


@pytest.mark.parametrize("route", ["p.rekeyed", "p.batch_rekeyed"])
def test_a_retry_that_finds_the_next_step_already_ok_goes_on_past_it_at_once(route: str, hub: LocalHub) -> None:
    """The retry calls `rekeyed` again (its custom key changed) and hands over to `second`, OK before:
    skipped, the message goes on to `first` in the same task. A batch member used to stay PROCESSING
    there, neither entered again nor done, until the lost-chain repair."""
    failures: list[int] = []

    def fails_once(ctx) -> None:
        if not failures:
            failures.append(ctx.message.id)
            raise RuntimeError("the third step's system is away once")

    routes.HOOKS["first"] = fails_once
    view = hub.submit(route, {})
    hub.run()
    assert hub.get(view.id).state == "PARTLY_FAILED"
    hub.tick(seconds=120)
    assert hub.get(view.id).state == "OK"
    assert (routes.calls("rekeyed"), routes.calls("second"), routes.calls("first")) == (2, 1, 1)


def test_celerys_soft_limit_while_a_batch_waits_for_the_store_does_not_abandon_it(hub: LocalHub, monkeypatch) -> None:
    """The group's write of the first step meets an outage; Celery's soft time limit arrives during the
    pause before it is written again. The batch writes it again and carries its messages on, instead
    of leaving them PROCESSING (their calls' records too) for the repair, which would call again."""
    from openhub.core.errors import Interrupted
    from openhub.engine import hub as hubs  # where the hub's transactions begin (`Hub.transaction`)

    real, tries = hubs.transaction, []

    def away_once(*args, **kwargs):
        tries.append(1)
        if len(tries) == 2:  # the group's write of step `first`
            raise StoreUnavailable("message store unavailable: connection refused")
        return real(*args, **kwargs)

    def soft_limit(seconds: float) -> None:
        raise Interrupted("Celery's soft time limit, arriving while the batch waits for the store")

    views = [hub.submit("p.batch", {}) for _ in range(3)]  # before: the batch's transactions are counted
    monkeypatch.setattr(hubs, "transaction", away_once)
    monkeypatch.setattr(batch, "pause_before_retry", soft_limit)
    hub.run()
    assert [hub.get(v.id).state for v in views] == ["OK"] * 3
    assert routes.calls("first") == 3 and routes.calls("second") == 3
    assert all(state == "OK" for v in views for state, _ in _calls_of(v.id).values())


def test_a_member_that_stops_mid_batch_is_no_longer_listed_as_running(hub: LocalHub) -> None:
    """One message of three is rejected at `first`: while the other two call `second`, this process's
    heartbeat lists their two runs only (their step `first`'s runs ended when the lease was handed over),
    as a step task's would; the stopped message's run no longer keeps its lease alive."""
    from openhub.store import workers

    views = [hub.submit("p.batch", {}) for _ in range(3)]
    listed: list[int] = []
    routes.HOOKS["first"] = lambda ctx: (
        (_ for _ in ()).throw(openhub.Reject("refused")) if ctx.message.id == views[1].id else None
    )
    routes.HOOKS["second"] = lambda ctx: listed.append(len(workers._runs))
    hub.run()
    assert [hub.get(v.id).state for v in views] == ["OK", "FAILED", "OK"]
    assert listed == [2, 2]
    assert not workers._runs


def test_a_batch_members_call_duration_is_its_own_call_not_its_wait_for_the_others(hub: LocalHub) -> None:
    """Outside gevent a batch runs its members' steps one after another: the third's call begins after
    the first two. Its external-call record's duration is its call's (0.3 s), not that plus its turn."""
    import time

    routes.HOOKS["first"] = lambda ctx: time.sleep(0.3)  # the call's own time, not a synchronisation
    views = [hub.submit("p.batch", {}) for _ in range(3)]
    hub.run()
    assert [hub.get(v.id).state for v in views] == ["OK"] * 3
    with transaction() as conn:
        durations = list(
            conn.execute(
                select(ext_calls.c.duration_ms).where(ext_calls.c.step_key == "first").order_by(ext_calls.c.message_id)
            ).scalars()
        )
    assert len(durations) == 3 and all(300 <= d < 550 for d in durations), durations
