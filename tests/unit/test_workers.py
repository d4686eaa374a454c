"""Worker liveness rules: who is dead needs a witness, and a live worker vouches only for the runs it lists."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from openhub.store.workers import Liveness, dead_among

T0 = datetime(2026, 11, 23, 12, 0, 0)
DEAD_AFTER = timedelta(seconds=15)


def _w(name: str, up: float, seen: float, runs: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        id=name, up_since=T0 + timedelta(seconds=up), last_seen=T0 + timedelta(seconds=seen), runs=runs
    )


def test_a_worker_silent_while_another_kept_beating_is_dead() -> None:
    assert dead_among([_w("killed", 0, 10), _w("other", 0, 26)], DEAD_AFTER) == {"killed"}


def test_nobody_is_dead_right_after_an_outage_that_silenced_everyone() -> None:
    # Both stopped at 10 s when the store went away; the store came back at 100 s and "other" beat first.
    assert dead_among([_w("slow-to-beat", 0, 10), _w("other", 100, 101)], DEAD_AFTER) == set()


def test_after_an_outage_a_worker_that_never_came_back_is_dead_once_a_witness_lasted() -> None:
    assert dead_among([_w("gone", 0, 10), _w("other", 100, 116)], DEAD_AFTER) == {"gone"}


def test_a_worker_restarted_under_its_own_name_witnesses_its_old_self() -> None:
    assert dead_among([_w("old-incarnation", 0, 10), _w("new-incarnation", 20, 36)], DEAD_AFTER) == {"old-incarnation"}


def test_a_lone_worker_is_never_declared_dead() -> None:
    assert dead_among([_w("alone", 0, 10)], DEAD_AFTER) == set()


def test_a_live_worker_vouches_only_for_the_runs_it_lists() -> None:
    live = Liveness({"w": _w("w", 0, 30, runs="r1,r2")}, dead={"d"})
    leased = T0 + timedelta(seconds=20)
    assert live.run_in_flight("w", "r1", leased) is True
    assert live.run_in_flight("w", "r3", leased) is False  # its task crashed: the heartbeat after it omits it
    assert live.run_in_flight("w", "r4", T0 + timedelta(seconds=40)) is True  # leased after the last heartbeat
    assert live.run_in_flight("d", "r1", leased) is False
    assert live.run_in_flight("unknown", "r1", leased) is None
    assert live.run_in_flight("w", None, leased) is False


def test_a_run_begun_after_the_last_heartbeat_is_in_flight_whatever_the_workers_clock() -> None:
    # Issue 22, found by the multi-host rig: the worker's clock is 90 s behind the database's, so its
    # lease time (its clock) lies before a heartbeat (the database's) that was written before the run
    # began. The heartbeat says up to which run it has seen (#7): run 8 is new, not crashed.
    live = Liveness({"w": _w("w", 0, 30, runs="#7,6.ab,7.cd")}, dead=set())
    behind = T0 + timedelta(seconds=31 - 90)
    assert live.run_in_flight("w", "8.ef", behind) is True
    assert live.run_in_flight("w", "7.cd", behind) is True
    assert live.run_in_flight("w", "5.aa", behind) is False  # seen by the heartbeat and left out: crashed
    assert live.run_in_flight("w", "5.aa", T0 + timedelta(seconds=40)) is False  # whatever its clock says


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_the_heartbeat_holds_the_runs_lock_can_start_a_run() -> None:
    """Prefork forks a new child at any moment; one forked while the parent's heartbeat thread held the
    lock of the runs in flight waited forever at its first step (the review of issue 22's run numbers)."""
    from openhub.store import workers

    held, release = threading.Event(), threading.Event()

    def heartbeat_thread() -> None:
        with workers._runs_lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=heartbeat_thread)
    thread.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: start a run within a deadline, or say it could not
            done = threading.Event()

            def start_a_run() -> None:
                with workers.running():
                    done.set()

            threading.Thread(target=start_a_run, daemon=True).start()
            os._exit(0 if done.wait(5) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def _settings(url: str) -> Any:
    """The settings a driver starts this process's heartbeat with: its store, dead-after 1 s (the fence at
    0.75 s, a call refused at 0.5 s of silence, a beat every 0.2 s)."""
    from openhub.core.config import Settings

    return Settings.from_env({"OPENHUB_DATABASE_URL": url, "OPENHUB_WORKER_DEAD_AFTER": "1"})


@pytest.fixture
def heartbeating(tmp_path, monkeypatch):
    """This process heartbeats (as a worker's main process does) on a SQLite store, every 0.2 s, its
    fence at 0.75 s; the store's path is yielded."""
    from openhub.store import workers
    from openhub.store.db import dispose_engines
    from openhub.store.migrate import upgrade

    path = tmp_path / "store.db"
    settings = _settings(f"sqlite:///{path}")
    upgrade(settings.database_url)
    workers.start_heartbeat(settings, keep_trying=True)
    yield path
    workers.stop_heartbeat()
    dispose_engines()


def test_a_heartbeat_that_hangs_counts_as_a_store_away(heartbeating) -> None:
    # The review of the store gate: a heartbeat stuck in the store (here its write lock, held elsewhere)
    # neither failed nor succeeded, and the main process went on taking tasks it could not record.
    import sqlite3

    from openhub.store import workers
    from tests.support.waiting import wait_for

    wait_for(workers.store_reachable, 10, "the heartbeat to reach the store")
    holder = sqlite3.connect(heartbeating, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        wait_for(lambda: not workers.store_reachable(), 10, "the hung heartbeat to count as a store away")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_for(workers.store_reachable, 10, "the heartbeat to reach the store again")


def test_a_heartbeat_thread_that_ended_is_started_again(heartbeating) -> None:
    # The review of the store gate: a heartbeat thread that ended (a BaseException in it) left the store
    # reachable as its last heartbeat said, while others saw the process dead; or, its last one failed,
    # unreachable for good: the worker never took a task again.
    from openhub.store import workers
    from tests.support.waiting import wait_for

    heart = workers._heart
    assert heart is not None
    heart.stop(10)
    assert not heart.alive
    workers.store_reachable()  # the worker's gate asks: the thread is started again
    assert workers._heart is not heart and workers._heart is not None and workers._heart.alive
    renewed = workers._renewed
    wait_for(lambda: workers._renewed != renewed, 10, "the new thread to heartbeat")
    wait_for(workers.store_reachable, 10, "the store to count as reachable again")


def test_a_first_heartbeat_slow_to_connect_does_not_fence_the_step_after_it(tmp_path, monkeypatch) -> None:
    # Found with `make test-burn` (issue 40): a fresh pool process's first heartbeat opens its connection
    # to the store, which on a busy machine takes most of a second; the fence was counted from before that
    # connection, so the process's first step found its heartbeat "behind" at once and left its run to the
    # repair (test_flow's first message on PostgreSQL: "ended without an outcome: worker ... died").
    import time

    from sqlalchemy import event

    from openhub.store import workers
    from openhub.store.db import dispose_engines, get_engine
    from openhub.store.migrate import upgrade

    settings = _settings(f"sqlite:///{tmp_path / 'store.db'}")  # the fence at 0.75 s
    try:
        upgrade(settings.database_url)
        dispose_engines()  # the beat opens its own connection, as in a fresh process

        @event.listens_for(get_engine(settings.database_url), "connect")
        def slow_to_connect(*_: object) -> None:
            time.sleep(1.0)  # the fault: a connection that takes a busy machine's second

        # As start_heartbeat sets them, without its thread.
        monkeypatch.setattr(workers, "_beating", os.getpid())
        monkeypatch.setattr(workers, "_settings", settings)
        monkeypatch.setattr(workers, "_renewed", None)
        monkeypatch.setattr(workers, "_gap_ended", float("-inf"))
        workers.beat(workers.current_id(), "test", settings.database_url, broken=True)
        assert not workers.fenced(time.monotonic())  # the heartbeat was just written
    finally:
        dispose_engines()
        monkeypatch.undo()


def test_a_call_is_refused_once_the_heartbeat_cannot_reach_the_store(heartbeating) -> None:
    # Issue 33, break 6: the fence stopped calls only once the heartbeat was 3/4 of dead-after old. A call
    # is refused as soon as the last heartbeat failed, or its last success is older than half of it.
    import sqlite3

    from openhub.core.errors import Fenced
    from openhub.store import workers
    from tests.support.waiting import wait_for

    wait_for(workers.store_reachable, 10, "the heartbeat to reach the store")
    workers.check_fence()  # a current heartbeat: the call goes
    holder = sqlite3.connect(heartbeating, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the heartbeat hangs in the store
    try:

        def refused() -> bool:
            try:
                workers.check_fence()
            except Fenced:
                return True
            return False

        wait_for(refused, 10, "a call to be refused")
        silent = __import__("time").monotonic() - workers._renewed
        assert silent < workers.FENCE, silent  # before the old 3/4 fence
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_for(lambda: not refused(), 10, "calls to go again")


def test_the_heartbeat_threads_connection_slow_to_open_fences_no_call(tmp_path, monkeypatch) -> None:
    # The chain-gevent kill test found no 'died' repair once (the fence merge's revert): the heartbeat
    # thread opened its own connection at its first beat, a fifth of dead-after after the process's first
    # beat, just as the first tasks' steps called; on a loaded box opening it took about a second, the
    # heartbeat fell that far behind, and the worker refused its own first calls (its leases let go), so
    # it held no run when it was killed. The connection is opened by the first beat, before any step.
    import time

    from sqlalchemy import event

    from openhub.store import workers
    from openhub.store.db import dispose_engines
    from openhub.store.migrate import upgrade

    settings = _settings(f"sqlite:///{tmp_path / 'store.db'}")  # a call refused at 0.5 s of silence
    real = workers.sqlite_engine
    opened: list[float] = []

    def slow_to_open(url, **options):
        engine = real(url, **options)

        @event.listens_for(engine, "connect")
        def slow(*_: object) -> None:
            if not opened:
                time.sleep(0.8)  # the fault: the heartbeat's connection takes a loaded box's second to open
            opened.append(time.monotonic())

        return engine

    monkeypatch.setattr(workers, "sqlite_engine", slow_to_open)
    try:
        upgrade(settings.database_url)
        workers.start_heartbeat(settings)
        leased = time.monotonic()  # the first step's lease, taken once the heartbeat started
        refused = []
        while time.monotonic() - leased < 1.5:  # several beats, past the first of the thread
            if workers.call_fenced(leased):
                refused.append(time.monotonic() - leased)
            time.sleep(0.01)
        assert opened and not refused, refused
    finally:
        workers.stop_heartbeat()
        dispose_engines()
        monkeypatch.undo()


def test_a_workers_state_is_read_from_its_heartbeat_its_hold_and_its_runs() -> None:
    from openhub.service.worker_states import state_of

    table = [
        # gone, silent, held, says taking, in flight -> state
        ((True, True, True, True, 1), "gone"),
        ((False, True, True, False, 0), "store away"),
        ((False, True, False, True, 2), "store away"),
        ((False, False, False, True, 3), "taking work"),
        ((False, False, False, False, 0), "taking work"),  # let go: it takes again at its next heartbeat
        ((False, False, True, True, 0), "finishing"),  # held, its heartbeat has not read it yet
        ((False, False, True, False, 2), "finishing"),
        ((False, False, True, False, 0), "stopped"),
    ]
    for (gone, silent, held, says, in_flight), state in table:
        got = state_of(gone=gone, silent=silent, held=held, says_taking=says, in_flight=in_flight)
        assert got == state, (gone, silent, held, says, in_flight)
