"""Flower shows each step as its own task, named after the route and step, with the message id."""

from __future__ import annotations

import os
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
def flower(hub):  # noqa: ANN001, ANN201
    if hub.name != "redis-pg":
        pytest.skip("Flower follows task events through Redis; the filesystem transport has no event fanout")
    port = free_port()
    env = dict(os.environ, **hub.env, FLOWER_UNAUTHENTICATED_API="true")
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}",
                             "--address=127.0.0.1"], env=env, cwd=PROJECT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 60, "Flower to answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_flower_lists_step_tasks_by_name(flower, prefix) -> None:  # noqa: ANN001
    m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=f"fl-{uuid.uuid4().hex}")
    assert wait_final(m.id).state == "OK"

    def seen() -> dict:
        tasks = httpx.get(f"{flower}/api/tasks", params={"limit": 500}, timeout=5).json()
        return {t["name"] for t in tasks.values() if str(m.id) in str(t.get("args"))}

    names = wait_for(lambda: (lambda s: s if len(s) == 3 else None)(seen()), 60, "Flower to see the three steps")
    assert names == {"openhub.test.flow.a", "openhub.test.flow.b", "openhub.test.flow.c"}
