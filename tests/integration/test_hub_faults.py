"""A fault of the hub's own is never one of the message's failures (issue 33, break 10).

A run lost with its worker (killed, crashed), a lease the fence let go (a heartbeat fallen behind after
a store cut), a chain lost with the broker: the message is tried again, noted in its history, and its
failed count, which decides FAILED by OPENHUB_MAX_FAILS, is left alone. Only a step whose runs keep
taking their worker down with them (a poison message) ends FAILED, after OPENHUB_MAX_LOST_RUNS in a row.
In-process on LocalHub, on SQLite and on PostgreSQL; a worker's death is a BaseException out of its step
(nothing of the run comes back, and the process's heartbeat no longer lists it, as a dead one's).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from openhub.store import workers
from openhub.store.schema import transitions
from tests.support import promise_routes as routes
from tests.support.process_store import transaction
from tests.support.waiting import wait_for


class WorkerDied(BaseException):
    """The process running the step died with it (SIGKILL, out of memory, a segfault in a C library)."""


def _dies(times: int) -> Any:
    """A hook: the step's first `times` runs take their worker down; the later ones succeed."""
    died: list[int] = []

    def hook(ctx: Any) -> None:
        if len(died) < times:
            died.append(1)
            raise WorkerDied(f"run {len(died)} of {ctx.idempotency_key}")

    return hook


def _history(message_id: int) -> list[tuple[str, str | None]]:
    with transaction() as conn:
        return [
            (r.event, r.detail)
            for r in conn.execute(
                select(transitions.c.event, transitions.c.detail)
                .where(transitions.c.message_id == message_id)
                .order_by(transitions.c.id)
            )
        ]


def test_runs_lost_with_their_worker_count_no_failure(local_store_env: dict[str, str]) -> None:
    with routes.local_hub(OPENHUB_MAX_FAILS="1", **local_store_env) as hub:
        routes.HOOKS["second"] = _dies(2)
        view = hub.submit("p.flow", {})
        with pytest.raises(WorkerDied):
            hub.run()
        with pytest.raises(WorkerDied):
            hub.tick()  # the lost run repaired and re-driven at once: its worker dies again
        hub.tick()
        done = hub.get(view.id)
        assert (done.state, done.failed_count) == ("OK", 0), done  # two losses were two failures, FAILED
        assert routes.calls("first") == 1 and routes.calls("second") == 1
        lost = [detail for event, detail in _history(view.id) if event == "lease_expired"]
        assert len(lost) == 2 and all("died or its task crashed" in (d or "") for d in lost), lost
        assert routes.CONFIRMED == [(view.id, "OK")]


def test_a_step_that_takes_its_worker_down_every_time_ends_failed(local_store_env: dict[str, str]) -> None:
    with routes.local_hub(OPENHUB_MAX_LOST_RUNS="2", **local_store_env) as hub:
        routes.HOOKS["second"] = _dies(1000)
        view = hub.submit("p.flow", {})
        with pytest.raises(WorkerDied):
            hub.run()
        for _ in range(2):
            with pytest.raises(WorkerDied):
                hub.tick()
        hub.tick()  # the third run lost in a row: more than OPENHUB_MAX_LOST_RUNS
        done = hub.get(view.id)
        assert (done.state, done.error_code) == ("FAILED", "WORKER_LOST"), done
        assert "lost 3 times in a row" in (done.failed_error or ""), done.failed_error
        assert routes.CONFIRMED == [(view.id, "FAILED")]
        assert hub.tick().repaired == 0 and hub.get(view.id).state == "FAILED"


def test_a_run_that_came_back_starts_the_count_of_lost_runs_again(local_store_env: dict[str, str]) -> None:
    with routes.local_hub(OPENHUB_MAX_LOST_RUNS="2", OPENHUB_RETRY_INTERVAL="60", **local_store_env) as hub:
        runs: list[int] = []

        def hook(ctx: Any) -> None:  # dies twice, fails once (a run that came back), dies twice, succeeds
            runs.append(1)
            if len(runs) in (1, 2, 4, 5):
                raise WorkerDied(f"run {len(runs)}")
            if len(runs) == 3:
                raise RuntimeError("billing answered 503")

        routes.HOOKS["second"] = hook
        view = hub.submit("p.flow", {})
        with pytest.raises(WorkerDied):
            hub.run()
        with pytest.raises(WorkerDied):
            hub.tick()
        hub.tick()  # the third run fails: its outcome recorded
        assert hub.get(view.id).failed_count == 1
        with pytest.raises(WorkerDied):
            hub.tick(seconds=120)
        with pytest.raises(WorkerDied):
            hub.tick(seconds=120)
        hub.tick(seconds=120)
        done = hub.get(view.id)
        assert (done.state, done.failed_count) == ("OK", 1), done  # four lost, never more than two in a row


def test_a_lease_the_fence_let_go_counts_nothing(local_store_env: dict[str, str], monkeypatch) -> None:
    # A worker whose heartbeat fell behind (a store cut that healed, a stall) starts no step call on the
    # leases it took meanwhile: it lets them go. That was left to the repair, which counted a failure
    # each time: outages alone pushed messages to FAILED.
    real_beat = workers.beat

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the store is unreachable from this host")

    def fall_behind(ctx: Any) -> None:
        monkeypatch.setattr(workers, "beat", unreachable)  # the heartbeat stops while the first call is made
        wait_for(lambda: workers.fenced(float("inf")), timeout=10, what="the heartbeat to fall behind")

    # A fence of 1.5 s: a loaded machine delays a heartbeat thread by tenths of a second, not by that much.
    with routes.local_hub(
        OPENHUB_WORKER_DEAD_AFTER="2", OPENHUB_MAX_FAILS="0", OPENHUB_LEASE_GRACE="30", **local_store_env
    ) as hub:
        workers.start_heartbeat(hub.hub.settings)
        try:
            routes.HOOKS["first"] = fall_behind
            view = hub.submit("p.fused", {})  # the second step's lease is taken in the first's commit
            hub.run()
            assert routes.calls("second") == 0
            held = hub.get(view.id)
            assert (held.state, held.failed_count) == ("PARTLY_FAILED", 0), held
            monkeypatch.setattr(workers, "beat", real_beat)
            wait_for(lambda: not workers.fenced(float("inf")), timeout=10, what="the heartbeat to be written again")
            routes.HOOKS.clear()
            seen: list[tuple[int, bool]] = []
            routes.HOOKS["second"] = lambda ctx: seen.append((ctx.attempt, ctx.redelivered))
            hub.tick(seconds=60)
            done = hub.get(view.id)
            assert (done.state, done.failed_count) == ("OK", 0), done  # with OPENHUB_MAX_FAILS=0: no failure
            assert routes.calls("first") == 1 and routes.calls("second") == 1
            # The fenced run never ran its step: the call the next run makes is its first, not a redelivery
            # (its record was left as begun: attempt 2, redelivered).
            assert seen == [(1, False)], seen
            history = _history(view.id)
            assert any(e == "lease_dropped" and "FENCED" in (d or "") for e, d in history), history
            assert not any(e == "lease_expired" for e, _ in history), history
        finally:
            workers.stop_heartbeat()
