"""Flower shows each step as its own task, named after the route and step, with the message id (a
fused route: one task per message, named after its first step)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import httpx
import pytest

import openhub
from tests.support.backends import free_port
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import PROJECT


@pytest.fixture
def flower(hub):
    port = free_port()
    env = dict(os.environ, **hub.env, FLOWER_UNAUTHENTICATED_API="true")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env,
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def following() -> bool:
        """Flower answers before its event receiver is connected: a warm-up message must show up first."""
        m = openhub.submit(
            "test.flow",
            {"prefix": f"/flower-warmup-{uuid.uuid4().hex[:8]}"},
            source_system="CRM",
            correlation_id=f"fl-warmup-{uuid.uuid4().hex}",
        )
        wait_final(m.id)
        try:
            return bool(wait_for(lambda: _tasks_of(url, m.id) or None, 10, "Flower to see the warm-up", interval=0.5))
        except AssertionError:
            return False

    try:
        wait_for(up, 60, "Flower to answer")
        wait_for(following, 120, "Flower to follow the workers' events")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _tasks_of(url: str, message_id: int) -> list[dict]:
    """The tasks Flower lists for one message (its id is the step task's first argument)."""
    tasks = httpx.get(f"{url}/api/tasks", params={"limit": 500}, timeout=5).json()
    return [t for t in tasks.values() if re.search(rf"\b{message_id}\b", str(t.get("args")))]


def test_flower_lists_step_tasks_by_name(flower, prefix) -> None:
    m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"fl-{uuid.uuid4().hex}")
    assert wait_final(m.id).state == "OK"

    def seen() -> set[str]:
        return {t["name"] for t in _tasks_of(flower, m.id)}

    names = wait_for(lambda: (lambda s: s if len(s) == 3 else None)(seen()), 60, "Flower to see the three steps")
    assert names == {"openhub.test.flow.a", "openhub.test.flow.b", "openhub.test.flow.c"}


def test_flower_does_not_list_the_pollers_ticks(flower, prefix) -> None:
    # Beat sends one every 0.3 s here: listed, they would crowd out the steps of messages.
    m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"fl-{uuid.uuid4().hex}")
    assert wait_final(m.id).state == "OK"
    wait_for(lambda: len(_tasks_of(flower, m.id)) == 3 or None, 60, "Flower to see the three steps")
    names = {t["name"] for t in httpx.get(f"{flower}/api/tasks", params={"limit": 500}, timeout=5).json().values()}
    assert "openhub.poll" not in names and "openhub.test.flow.a" in names


def test_flower_lists_one_task_per_message_of_a_fused_route(flower, prefix) -> None:
    m = openhub.submit("fused.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"fl-{uuid.uuid4().hex}")
    done = wait_final(m.id)
    assert done.state == "OK" and [c.step for c in done.ext_calls] == ["a", "b", "c"]  # every step recorded

    def ended() -> list[dict] | None:
        tasks = _tasks_of(flower, m.id)
        return tasks if tasks and all(t["state"] in ("SUCCESS", "FAILURE") for t in tasks) else None

    tasks = wait_for(ended, 60, "Flower to see the fused task end")
    assert [(t["name"], t["state"]) for t in tasks] == [("openhub.fused.flow.a", "SUCCESS")]


def test_flower_shows_a_failed_attempt_as_a_failed_task(flower, prefix, external) -> None:
    external.fail(f"{prefix}/b", times=1)  # billing answers 503 once: the hub retries, Flower must not say SUCCESS
    m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"fl-{uuid.uuid4().hex}")
    assert wait_final(m.id).state == "OK"

    def states() -> list[tuple[str, str]] | None:
        mine = [(t["name"], t["state"], str(t.get("exception") or t.get("result"))) for t in _tasks_of(flower, m.id)]
        return mine if len([s for s in mine if s[0].endswith(".b")]) >= 2 else None

    seen = wait_for(states, 60, "Flower to see both attempts of step b")
    b = sorted(s for s in seen if s[0] == "openhub.test.flow.b")
    assert [state for _n, state, _r in b] == ["FAILURE", "SUCCESS"], b
    failure = next(r for _n, state, r in b if state == "FAILURE")
    assert "transient" in failure and "503" in failure, failure


def test_flower_shows_a_step_skipped_on_a_retry_as_skipped_not_as_a_fresh_success(flower, prefix, external) -> None:
    # Issue 40: the retry's chain starts at step a again, which finds its call recorded OK and makes none;
    # Flower listed it as one more SUCCESS, as if a were called twice.
    external.fail(f"{prefix}/b", times=1)
    m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"fl-{uuid.uuid4().hex}")
    assert wait_final(m.id).state == "OK"

    def step_a() -> list[tuple[str, str]] | None:
        mine = [(t["state"], str(t.get("result"))) for t in _tasks_of(flower, m.id) if t["name"].endswith(".a")]
        return mine if len(mine) >= 2 and all(state == "SUCCESS" for state, _r in mine) else None

    results = sorted(result for _state, result in wait_for(step_a, 60, "Flower to see both tasks of step a"))
    assert results == ["'ok'", "'skipped: already done (recorded OK before, no call made)'"], results
    assert external.count(f"{prefix}/a") == 1
