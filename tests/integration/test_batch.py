"""Batch routes (`Route(batch=N)`) on LocalHub, which runs them through the workers' batch runner
(openhub.engine.batch): many messages per task, each step entered and recorded for all of them in one
transaction, every promise kept per message. On SQLite, then on PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy import select

import openhub
from openhub.core.errors import StepFailed
from openhub.engine.batch import run_batch, summary
from openhub.store.schema import Base, transitions
from openhub.testing import ExternalSystem, LocalHub
from tests.support.checks import assert_each_step_ok_once
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import PROJECT


@pytest.fixture
def system(monkeypatch: pytest.MonkeyPatch) -> Iterator[ExternalSystem]:
    system = ExternalSystem().start()
    monkeypatch.setenv("OPENHUB_TEST_EXTERNAL_URL", system.url)
    yield system
    system.stop()


@pytest.fixture
def local(local_store_env: dict[str, str], system: ExternalSystem) -> Iterator[LocalHub]:
    if "OPENHUB_DATABASE_URL" in local_store_env:  # the shared PostgreSQL store, emptied for this test
        with transaction(local_store_env["OPENHUB_DATABASE_URL"]) as conn:
            conn.exec_driver_sql(
                f"TRUNCATE {', '.join(t.name for t in Base.metadata.sorted_tables)} RESTART IDENTITY CASCADE"
            )
    with LocalHub("tests.support.routes", OPENHUB_RETRY_INTERVAL="60", **local_store_env) as local:
        yield local


def _prefix() -> str:
    return f"/b{uuid.uuid4().hex[:8]}"


def _history(message_id: int) -> list[str]:
    with transaction() as conn:
        return list(
            conn.execute(
                select(transitions.c.event).where(transitions.c.message_id == message_id).order_by(transitions.c.id)
            ).scalars()
        )


def test_a_batch_carries_its_messages_step_by_step_each_step_called_once(
    local: LocalHub, system: ExternalSystem
) -> None:
    prefix = _prefix()
    ids = [local.submit("batched.flow", {"prefix": prefix, "n": n}).id for n in range(5)]
    assert len(local.publisher.chains) == 5
    assert local.run() == 5
    assert all(local.get(i).state == "OK" for i in ids)
    for name in "abc":
        assert system.count(f"{prefix}/{name}") == 5 and system.effects(f"{prefix}/{name}") == 5
    # Lockstep: every message's step a ended before any step b began (one task carried them all).
    calls = [c for c in system.calls if c.path.startswith(prefix)]
    last_a = max(c.ended for c in calls if c.path.endswith("/a"))
    assert last_a <= min(c.started for c in calls if c.path.endswith("/b"))


def test_mixed_outcomes_in_one_batch_each_go_their_own_way(local: LocalHub, system: ExternalSystem) -> None:
    prefixes = {name: _prefix() for name in ("ok", "transient", "reject", "postpone", "no_effect")}
    scripts = {
        "reject": {"b": {"reject": True}},
        "postpone": {"c": {"postpone_once": True}},
        "no_effect": {"b": {"no_effect_once": True}},
    }
    system.fail(f"{prefixes['transient']}/b", times=1)
    ids = {
        name: local.submit("batched.flow", {"prefix": p, "script": scripts.get(name, {})}).id
        for name, p in prefixes.items()
    }
    assert local.run() == 5
    states = {name: local.get(i).state for name, i in ids.items()}
    assert states == {
        "ok": "OK",
        "transient": "PARTLY_FAILED",
        "reject": "FAILED",
        "postpone": "POSTPONED",
        "no_effect": "PARTLY_FAILED",
    }, states
    local.tick(seconds=120)  # the retries and the postponed message, re-driven together: a batch again
    states = {name: local.get(i).state for name, i in ids.items()}
    assert states == {"ok": "OK", "transient": "OK", "reject": "FAILED", "postpone": "OK", "no_effect": "OK"}
    for name, p in prefixes.items():  # no successful call made twice
        assert system.effects(f"{p}/a") == 1 and system.count(f"{p}/a") == 1
        assert system.count(f"{p}/c", 200) == (0 if name == "reject" else 1)
    assert system.count(f"{prefixes['transient']}/b") == 2  # the failed call, then its retry


def test_a_batch_route_waits_for_a_response_and_splits(local: LocalHub, system: ExternalSystem) -> None:
    prefix = _prefix()
    waiting = [
        openhub.submit(
            "batched.wait", {"prefix": prefix, "n": n}, source_system="CRM", correlation_id=f"w-{prefix}-{n}"
        ).id
        for n in range(3)
    ]
    order = local.submit("batched.order", {"prefix": prefix, "lines": [{"sku": 1}, {"sku": 2}, {"sku": 3}]})
    local.run()
    assert [local.get(i).state for i in waiting] == ["WAITING_FOR_RES"] * 3
    assert local.get(order.id).state == "OK" and system.effects(f"{prefix}/line") == 3
    for n, i in enumerate(waiting):
        openhub.respond(i, {"answer": n})
    local.run()
    assert [local.get(i).state for i in waiting] == ["OK"] * 3
    assert [local.get(i).custom_data["answer"] for i in waiting] == [{"answer": n} for n in range(3)]
    assert system.effects(f"{prefix}/request") == 3 and system.effects(f"{prefix}/answered") == 3


@pytest.mark.parametrize("which, step", [(1, "b"), (0, "b"), (0, "c")])
def test_a_message_cancelled_while_its_batch_runs_stops_and_the_others_go_on(
    local: LocalHub, system: ExternalSystem, which: int, step: str
) -> None:
    """The cancelled message's outcome is discarded (on PostgreSQL the group's one statement that writes
    the outcomes leaves it out: its compare-and-set fails, and it is written alone), handed over (step b)
    or recorded (the last step, c); the first member (`which` 0) has no read of its lease before its next
    call to stop it: only that compare-and-set does."""
    prefixes = [_prefix() for _ in range(3)]
    ids = [local.submit("batched.flow", {"prefix": p}).id for p in prefixes]
    slow = f"{prefixes[which]}/{step}"
    system.delay(slow, 1.0)  # that message's step is in flight when the operator cancels it
    runner = threading.Thread(target=local.run)
    runner.start()
    wait_for(lambda: system.started_events[slow].is_set(), timeout=30, what="the slow call to begin")
    openhub.cancel(ids[which])
    runner.join(timeout=60)
    assert not runner.is_alive()
    others = [p for n, p in enumerate(prefixes) if n != which]
    assert [local.get(i).state for i in ids] == ["CANCEL" if n == which else "OK" for n in range(3)]
    assert [system.count(f"{prefixes[which]}/{name}") for name in "abc"] == [1, 1, int(step == "c")]
    assert all(system.count(f"{p}/{name}") == 1 for p in others for name in "abc")
    history = _history(ids[which])
    assert history[history.index("cancelled") :] == ["cancelled"]  # nothing written after it


def test_a_batch_claims_no_member_cancelled_or_of_a_stale_chain_and_the_others_go_on(
    local: LocalHub, system: ExternalSystem
) -> None:
    """Issue 42: on PostgreSQL the batch claims its members at the first step in one statement, each under
    its own compare-and-set (openhub.engine.batch_claims): a member cancelled before its batch task ran, and
    one whose task carries an old token (its chain was published again since), are not claimed by it and
    make no call (entered alone, they stop there); the others go on, and the stale one's own chain does."""
    prefixes = [_prefix() for _ in range(4)]
    ids = [local.submit("batched.flow", {"prefix": p}).id for p in prefixes]
    chains = {message_id: token for _route, message_id, token, _start, _trace, _priority in local.publisher.chains}
    local.publisher.chains.clear()
    openhub.cancel(ids[1])
    pairs = [(i, "an-old-token" if n == 2 else chains[i]) for n, i in enumerate(ids)]
    assert local.hub is not None
    run_batch("batched.flow", 0, pairs, hub=local.hub)
    assert [local.get(i).state for i in ids] == ["OK", "CANCEL", "NEW", "OK"]
    assert [system.count(f"{prefixes[n]}/a") for n in range(4)] == [1, 0, 0, 1]
    assert _history(ids[1])[-1] == "cancelled" and "claimed" not in _history(ids[2])
    run_batch("batched.flow", 0, [(ids[2], chains[ids[2]])], hub=local.hub)  # its own chain
    assert local.get(ids[2]).state == "OK"
    assert all(system.count(f"{prefixes[n]}/{name}") == 1 for n in (0, 2, 3) for name in "abc")


def test_a_batch_of_a_paused_route_claims_none_of_its_members_until_resumed(
    local: LocalHub, system: ExternalSystem
) -> None:
    """The batch's one claim statement (PostgreSQL) claims nothing while its route is paused: each member is
    entered alone and postponed, as one message is; resumed, they run, each step once."""
    prefixes = [_prefix() for _ in range(3)]
    openhub.pause("batched.flow")
    ids = [local.submit("batched.flow", {"prefix": p}).id for p in prefixes]
    local.run()
    assert [local.get(i).state for i in ids] == ["POSTPONED"] * 3
    assert all(system.count(f"{p}/a") == 0 for p in prefixes)
    openhub.resume("batched.flow")
    local.tick(seconds=600)
    assert [local.get(i).state for i in ids] == ["OK"] * 3
    assert all(system.count(f"{p}/{name}") == 1 for p in prefixes for name in "abc")


def test_a_member_cancelled_while_an_earlier_members_call_runs_makes_no_call(
    local: LocalHub, system: ExternalSystem
) -> None:
    """Issue 33, break 3: the members' calls run one after another (prefork); a member cancelled while an
    earlier member's call is in flight must not make its own (its state is read right before its call),
    and the others go on."""
    prefixes = [_prefix() for _ in range(3)]
    ids = [local.submit("batched.flow", {"prefix": p}).id for p in prefixes]
    held = f"{prefixes[0]}/b"
    release = system.hold(held)  # the first member's step b in flight until the cancel is done
    runner = threading.Thread(target=local.run)
    runner.start()
    try:
        wait_for(lambda: system.started_events[held].is_set(), timeout=30, what="the first member's call to begin")
        openhub.cancel(ids[1])
    finally:
        release.set()
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert [local.get(i).state for i in ids] == ["OK", "CANCEL", "OK"]
    assert system.count(f"{prefixes[1]}/b") == 0 and system.count(f"{prefixes[1]}/c") == 0
    assert all(system.count(f"{p}/{name}") == 1 for p in (prefixes[0], prefixes[2]) for name in "abc")


def test_a_worker_runs_batches_on_both_backends(hub, external, prefix) -> None:
    """The session's real worker: messages submitted together go in one batch task (Flower shows
    `openhub.batched.flow.batch`), each step of each message called once."""
    ids = [
        v.id
        for v in openhub.submit_many(
            [
                {
                    "route": "batched.flow",
                    "payload": {"prefix": prefix},
                    "source_system": "CRM",
                    "correlation_id": f"{prefix}-{n}",
                }
                for n in range(10)
            ]
        )
    ]
    assert [wait_final(i).state for i in ids] == ["OK"] * 10
    for name in "abc":
        assert external.count(f"{prefix}/{name}") == 10 and external.effects(f"{prefix}/{name}") == 10
    assert_each_step_ok_once(ids, ["a", "b", "c"])
    assert "openhub.batched.flow.batch" in hub.workers[0].log()


def test_prefork_batch_starts_no_call_after_its_worker_lost_the_store(tmp_path: Path) -> None:
    """Issue 33, break 6: a prefork worker runs its batch members' calls one after another, before the one
    group write. Cut from PostgreSQL (here through a proxy) while the first member's call is in flight, it
    went on to start the later members' calls; another worker judged it dead and repaired the batch, and
    those calls were made again. Now each member's lease is read right before its call: no later call is
    started, and each later member's call is made once (by the worker that took the repair)."""
    from tests.support import backends
    from tests.support.tcpproxy import TcpProxy
    from tests.support.workers import Worker

    saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    external = ExternalSystem().start()
    try:
        with backends.backend("redis-pg", tmp_path / "store", {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as b:
            url = sqlalchemy.engine.make_url(b.database_url)
            proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
            cut_off = Worker(
                dict(
                    b.env,
                    OPENHUB_DATABASE_URL=url.set(host="127.0.0.1", port=proxy.port).render_as_string(
                        hide_password=False
                    ),
                ),
                tmp_path,
                beat=False,
                concurrency=1,
            )
            witness = Worker(b.env, tmp_path, concurrency=1)  # with the beat: its poller repairs
            try:
                cut_off.start()
                b.workers.append(cut_off)
                prefixes = [_prefix() for _ in range(3)]
                held = f"{prefixes[0]}/b"
                release = external.hold(held)
                ids = [
                    v.id
                    for v in openhub.submit_many(
                        [
                            {
                                "route": "batched.flow",
                                "payload": {"prefix": p},
                                "source_system": "CRM",
                                "correlation_id": f"cut-{uuid.uuid4().hex}",
                            }
                            for p in prefixes
                        ]
                    )
                ]
                try:
                    wait_for(
                        lambda: external.started_events[held].is_set(),
                        timeout=60,
                        what="the first member's call in flight",
                    )
                    proxy.cut()
                finally:
                    release.set()
                witness.start()
                b.workers.append(witness)
                assert [wait_final(i, timeout=120).state for i in ids] == ["OK"] * 3
                for p in prefixes[1:]:
                    assert external.count(f"{p}/b") == 1, (p, cut_off.log()[-3000:])
                    assert external.count(f"{p}/c") == 1
            finally:
                witness.stop()
                cut_off.stop()
        backends.activate(saved)
    finally:
        external.stop()


GREEN_ROUTES = """
import time
from openhub import Route, step

STARTED, ENDED = [], []


@step
def slow(ctx):
    STARTED.append(ctx.message.id)
    time.sleep(1.0)  # gevent's, patched: a call in flight
    ENDED.append(ctx.message.id)


routes = [Route("green.slow", steps=[slow], batch=3)]
"""

GREEN_TASK = """
from gevent import monkey; monkey.patch_all()
import gevent
import green_routes
from openhub.testing import LocalHub

with LocalHub("green_routes") as local:
    for n in range(3):
        local.submit("green.slow", {"n": n})
    ran = gevent.spawn(local.run)
    with gevent.Timeout(60):
        while len(green_routes.STARTED) < 3:  # the three calls in flight
            gevent.sleep(0.01)
    ran.kill(gevent.Timeout, block=True)  # Celery's hard limit under gevent, in the task's greenlet
    gevent.sleep(1.5)  # longer than the calls take
    print(type(ran.exception).__name__, green_routes.ENDED)
"""


def test_under_gevent_a_batch_stopped_by_its_hard_limit_stops_its_steps_calls(tmp_path: Path) -> None:
    """Celery's hard time limit under gevent is a gevent.Timeout in the task's greenlet: the step
    greenlets of the batch must end with it, before its runs are unlisted and the repair may call again,
    not go on calling out behind it."""
    pytest.importorskip("gevent")
    (tmp_path / "green_routes.py").write_text(textwrap.dedent(GREEN_ROUTES))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENHUB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(tmp_path)])
    done = subprocess.run(
        [sys.executable, "-c", GREEN_TASK], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "Timeout []", done.stdout[-2000:]


def test_a_batch_task_where_a_step_failed_raises_step_failed_for_flower(
    local: LocalHub, system: ExternalSystem
) -> None:
    """The batch task returns how many of its messages came to what; where a message's step failed, it
    raises StepFailed naming it (after everything is recorded), as a step task does: Flower shows it."""
    prefixes = [_prefix() for _ in range(3)]
    ids = [
        local.submit("batched.flow", {"prefix": p, "script": {"b": {"reject": True}} if n == 1 else {}}).id
        for n, p in enumerate(prefixes)
    ]
    pairs = [(message_id, token) for _route, message_id, token, _start, _trace, _priority in local.publisher.chains]
    local.publisher.chains.clear()
    assert local.hub is not None
    reports = run_batch("batched.flow", 0, pairs, hub=local.hub)
    assert [local.get(i).state for i in ids] == ["OK", "FAILED", "OK"]  # recorded before it is raised
    with pytest.raises(StepFailed, match=f"1 of 3 message\\(s\\) failed a step: message {ids[1]}: rejected"):
        summary(reports)
    assert summary({i: reports[i] for i in (ids[0], ids[2])}) == {"ok": 2}
