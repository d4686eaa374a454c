"""Worker states (issue 36, item 4): an operator tells a worker to finish what it has and take nothing new,
and lets it take work again, with real `celery -A tasks worker` processes on both backends.

Two workers of one concurrency each serve the hub. The first takes a message whose call the external system
holds; told to finish, it says so in the store (its heartbeat's `taking`), takes none of the messages
submitted while it is held (the other worker does them all), not even once its call is let go and it runs
idle, and finishes the one it had. `openhub workers` shows it finishing, then stopped; on Redis Celery's
`inspect stats` (what Flower's worker page shows) says `finishing: <reason>`, also after the broker
restarted. Let go, it takes again: with the other worker stopped, it does the next message.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import pytest

import openhub
from openhub.core.config import get_settings
from openhub.service import worker_states
from openhub.store import audit
from tests.support import backends
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import Worker


def _made_by(external: Any, path: str) -> list[str]:
    return [c.headers.get("x-test-worker", "?") for c in external.calls if c.path == path and c.status < 400]


def _state_of(worker: Worker) -> dict[str, Any] | None:
    assert worker.process is not None
    mine = [w for w in worker_states.worker_states() if w["node"].endswith(f":{worker.process.pid}")]
    return mine[0] if mine else None


def _submit(prefix: str, n: int) -> list[int]:
    return [
        openhub.submit("test.held", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex).id
        for _ in range(n)
    ]


def _stats_state(worker: Worker) -> str | None:
    from openhub.celery.dispatch import celery_app

    name = f"{worker.name}@{socket.gethostname()}"
    try:
        replies = celery_app().control.inspect(timeout=2, destination=[name]).stats() or {}
    except Exception as exc:  # this process's connection to a broker that restarted: asked again
        return f"not asked: {exc}"
    return (replies.get(name) or {}).get("openhub_state")


@pytest.mark.parametrize("name", ["embedded", "redis-pg"])
def test_a_worker_told_to_finish_takes_nothing_new_finishes_what_it_has_and_takes_again_when_let_go(
    name, tmp_path, external
) -> None:
    prefix = f"/ws-{uuid.uuid4().hex[:8]}"
    before = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    started: list[Worker] = []
    try:
        with backends.backend(name, tmp_path / name, {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as own:
            held = Worker(own.env, own.workdir, beat=False, concurrency=1, name="held").start()
            started.append(held)
            release = external.hold(f"{prefix}-first/a", timeout=120)
            (first,) = _submit(f"{prefix}-first", 1)
            wait_for(lambda: _made_by_started(external, f"{prefix}-first/a"), 60, "the held worker to take the first")
            other = Worker(own.env, own.workdir, beat=False, concurrency=1, name="other").start()
            started.append(other)
            state = wait_for(
                lambda: (s := _state_of(held)) is not None and s["in_flight"] == 1 and s,
                30,
                "the held worker's heartbeats to show its step run",
            )
            assert state["state"] == "taking work" and state["processes"] == 2, state

            worker_states.finish_worker(state["id"], "host patch 7")
            wait_for(lambda: (_state_of(held) or {}).get("taking") is False, 30, "the worker to say it holds")
            now = _state_of(held)
            assert now is not None and now["state"] == "finishing" and now["reason"] == "host patch 7", now
            entries = audit.entries(action="worker.finish", url=get_settings().database_url)
            assert len(entries) == 1 and entries[0]["target"] == f"worker {state['id']}"
            if name == "redis-pg":
                wait_for(lambda: _stats_state(held) == "finishing: host patch 7", 30, "Celery's stats to say so")
                own.redis.restart()  # a broker reconnection: the hold is the store's, and holds
                wait_for(lambda: _stats_state(other) == "taking work", 60, "the other worker to reconnect")
                wait_for(lambda: _stats_state(held) == "finishing: host patch 7", 60, "the held worker to reconnect")

            during = _submit(f"{prefix}-during", 4)
            assert all(wait_final(i, timeout=120).state == "OK" for i in during)
            assert _made_by(external, f"{prefix}-during/a") == ["other"] * 4  # the held worker took none
            release.set()  # its call goes on: the one it had, it finishes
            assert wait_final(first, timeout=120).state == "OK"
            assert _made_by(external, f"{prefix}-first/a") == ["held"]
            wait_for(lambda: (_state_of(held) or {}).get("state") == "stopped", 30, "the held worker to be stopped")
            after = _submit(f"{prefix}-after", 3)  # idle now, it still takes none
            assert all(wait_final(i, timeout=120).state == "OK" for i in after)
            assert _made_by(external, f"{prefix}-after/a") == ["other"] * 3

            worker_states.resume_worker(state["id"])
            assert len(audit.entries(action="worker.resume", url=get_settings().database_url)) == 1
            wait_for(lambda: (_state_of(held) or {}).get("state") == "taking work", 30, "the worker to take again")
            other.stop()
            again = _submit(f"{prefix}-again", 2)
            assert all(wait_final(i, timeout=120).state == "OK" for i in again)
            assert _made_by(external, f"{prefix}-again/a") == ["held"] * 2
            log = held.log()
            assert "an operator told this worker to finish what it has (host patch 7)" in log
            assert "an operator let this worker take work again" in log
    finally:
        for w in started:
            w.stop()
        backends.activate(before)


def _made_by_started(external: Any, path: str) -> bool:
    return any(h.get("x-test-worker") == "held" for p, h in list(external.started) if p == path)
