"""Fixtures shared by the suite: backends, real workers, a real external system.

The behaviour suite runs twice, on the embedded default (SQLite + filesystem transport) and on
Redis + PostgreSQL. Workers are real `celery -A tasks worker` subprocesses; pytest-celery's
Docker fixtures cannot run here (no Docker engine), so Celery's own in-process fixtures are
imported to shadow them.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from celery.contrib.pytest import celery_app, celery_worker  # noqa: F401 - shadow pytest-celery's Docker ones

from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.pools import POOL_OPTIONS
from tests.support.workers import Worker

BACKENDS = ["embedded", "redis-pg"]


def pytest_configure(config: pytest.Config) -> None:
    """`make test` starts three of its four pytest processes with `&`, and a non-interactive shell starts
    those with SIGINT ignored (POSIX), which Python then keeps and every process a test starts inherits: the
    `openhub status --watch` a test ends with Ctrl-C (SIGINT) ran on for ever in those streams. A terminal's
    Ctrl-C is what the tests mean: Python's own handler, as in a foreground run."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def external() -> Iterator[ExternalSystem]:
    """A real HTTP external system on 127.0.0.1 with counters and failure injection."""
    system = ExternalSystem().start()
    yield system
    system.stop()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, external: ExternalSystem, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[backends.Backend]:
    """A fresh, migrated store and broker, activated in this process."""
    workdir = tmp_path_factory.mktemp(request.param)
    with backends.backend(request.param, workdir, {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as b:
        yield b
        for w in b.workers:
            w.stop()


@pytest.fixture(scope="session")
def local_store() -> Iterator[str]:
    """A migrated PostgreSQL database for LocalHub tests that also run on PostgreSQL (each empties it)."""
    from openhub.store.migrate import upgrade

    with backends.postgres_database("openhub_local") as url:
        upgrade(url)
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def local_store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment of a LocalHub on SQLite (its default), then on PostgreSQL, where the engine and
    the producer write some steps in fewer statements."""
    return {"OPENHUB_DATABASE_URL": request.getfixturevalue("local_store")} if request.param == "postgresql" else {}


@pytest.fixture(scope="session")
def pool(request: pytest.FixtureRequest) -> str:
    """The pool of the session's worker: prefork, unless a test is marked ON_EVERY_POOL (tests/support/pools.py)."""
    return getattr(request, "param", None) or "prefork"


@pytest.fixture(scope="session")
def worker(backend: backends.Backend, pool: str) -> Iterator[Worker]:
    """A real Celery worker (with its beat) on `pool` serving tests/support/routes.py on the backend;
    the only one of the session on it (another pool's is stopped first, so it takes no task)."""
    backend.activate()
    w = Worker(backend.env, backend.workdir, **POOL_OPTIONS[pool]).start()
    backend.workers.append(w)
    yield w
    w.stop()
    backend.workers.remove(w)


@pytest.fixture(params=["test", "fused"], ids=["chain", "fused"])
def svc(request: pytest.FixtureRequest) -> str:
    """The service of the behaviour suite's routes: "test" runs them in chain mode (a Celery task per
    step), "fused" the same routes in fused mode (a task per run of steps)."""
    return request.param


@pytest.fixture
def prefix() -> str:
    """A unique path on the external system for one test."""
    return f"/t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def hub(backend: backends.Backend, worker: Worker) -> backends.Backend:
    """The backend with a running worker, activated in this process."""
    backend.activate()
    assert worker.process is not None and worker.process.poll() is None, worker.log()[-2000:]
    return backend


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run unit tests first, then the rest grouped by backend, chaos tests last."""
    order = {"unit": 0, "integration": 1, "acceptance": 2, "chaos": 3}
    items.sort(key=lambda item: order.get(Path(str(item.fspath)).parent.name, 1))
