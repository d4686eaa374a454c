"""Docker smoke test (README.md, "Layout": tests): the hub against a Redis broker in a container.

These machines have the Docker client but no engine, so the test skips cleanly where no engine
answers; on a developer's machine with Docker it runs a real worker against `redis:7` in a
container and the local PostgreSQL, and carries one message to OK.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import openhub
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.checks import assert_each_step_ok_once
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import Worker


def _engine() -> Any:
    """A Docker client whose engine answers a ping, or None."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        return client
    except Exception:
        return None


pytestmark = pytest.mark.skipif(_engine() is None, reason="no Docker engine answers here")


def test_a_message_goes_through_a_redis_broker_in_a_container(tmp_path: Path, external: ExternalSystem) -> None:
    client = _engine()
    container = client.containers.run("redis:7", detach=True, remove=True, ports={"6379/tcp": ("127.0.0.1", None)})
    try:

        def port() -> str | None:
            container.reload()
            bound = container.ports.get("6379/tcp")
            return bound[0]["HostPort"] if bound else None

        host_port = wait_for(port, 60, "the container's Redis port")
        with backends.postgres_database() as url:
            env = dict(
                backends.TEST_SETTINGS,
                OPENHUB_VAR_DIR=str(tmp_path / "var"),
                OPENHUB_DATABASE_URL=url,
                OPENHUB_BROKER_URL=f"redis://127.0.0.1:{host_port}/0",
                OPENHUB_TEST_EXTERNAL_URL=external.url,
            )
            backends.activate(env)
            from openhub.store.migrate import upgrade

            upgrade(url)
            worker = Worker(env, tmp_path).start()
            try:
                prefix = f"/docker-{uuid.uuid4().hex[:8]}"
                view = openhub.submit(
                    "test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex
                )
                assert wait_final(view.id, timeout=90).state == "OK"
                assert_each_step_ok_once([view.id], ["a", "b", "c"])
            finally:
                worker.stop()
    finally:
        container.stop()
