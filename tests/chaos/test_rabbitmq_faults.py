"""RabbitMQ's faults (README.md, "Brokers"), on one private RabbitMQ node and PostgreSQL database for the
module, real workers and a real HTTP external system: a worker SIGKILLed mid-step, RabbitMQ stopped and
started mid-run, every connection cut from the server's side, a delivery taken back by RabbitMQ's
consumer_timeout while its step runs, publishes the broker refuses (publisher confirms). Every message
ends final, each step recorded OK once, no external effect made twice, no successful call repeated by
a live worker.

What RabbitMQ does instead of the hub's Redis machinery: unacknowledged deliveries go back to their
queue when the connection or channel that held them closes (so no repair of prefetched tasks, no
visibility timeout); durable queues and persistent messages outlive a restart (so no chain-lost look).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

import openhub
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.checks import assert_each_step_ok_once
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import Worker

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[backends.Backend, ExternalSystem]]:
    external = ExternalSystem().start()
    workdir = tmp_path_factory.mktemp("rabbit-faults")
    try:
        with backends.backend("rabbit-pg", workdir, {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as b:
            yield b, external
    finally:
        external.stop()


@pytest.fixture
def hub(rabbit, tmp_path: Path) -> Iterator[tuple[backends.Backend, ExternalSystem, Path]]:
    backend, external = rabbit
    backend.activate()
    yield backend, external, tmp_path
    for w in backend.workers:
        w.stop()
    backend.workers.clear()


def _workers(backend: backends.Backend, workdir: Path, n: int, **env: str) -> list[Worker]:
    workers = [Worker({**backend.env, **env}, workdir / f"w{k}", beat=k == 0, concurrency=2).start() for k in range(n)]
    backend.workers += workers
    return workers


def _submit(route: str, prefix: str, n: int) -> list[int]:
    return [
        v.id
        for v in openhub.submit_many(
            [
                {
                    "route": route,
                    "payload": {"prefix": prefix},
                    "source_system": "CRM",
                    "correlation_id": f"rabbit-{uuid.uuid4().hex}",
                }
                for _ in range(n)
            ]
        )
    ]


def _assert_done_once(ids: list[int], prefix: str, steps: list[str], external: ExternalSystem) -> None:
    views = [wait_final(i, timeout=120) for i in ids]
    assert [v.state for v in views] == ["OK"] * len(ids), [(v.id, v.state, v.failed_error) for v in views]
    assert_each_step_ok_once(ids, steps)
    for s in steps:
        assert external.effects(f"{prefix}/{s}") == len(ids), s


def _assert_no_live_worker_repeated_a_call(external: ExternalSystem, prefix: str) -> None:
    calls = Counter(
        (c.headers.get("x-test-worker"), c.path, c.key) for c in external.calls if c.path.startswith(prefix)
    )
    assert {k: n for k, n in calls.items() if n > 1} == {}


def _assert_no_successful_call_repeated(external: ExternalSystem, prefix: str) -> None:
    replays = [(c.path, c.key) for c in external.calls if c.replay and c.path.startswith(prefix)]
    assert not replays, f"successful calls made again: {replays[:10]}"


def _assert_alive(workers: list[Worker]) -> None:
    exited = [(w.name, w.log()[-3000:]) for w in workers if w.process is not None and w.process.poll() is not None]
    assert not exited, exited


def test_a_worker_killed_mid_step_its_deliveries_go_back_at_once(hub) -> None:
    backend, external, workdir = hub
    prefix = f"/rkill-{uuid.uuid4().hex[:6]}"
    survivor, victim = _workers(backend, workdir, 2)  # the survivor runs the poller
    external.delay(f"{prefix}/patient", 3.0)
    ids = _submit("test.long", prefix, 8)
    # The victim made a first call (it took tasks) and slow calls are under way: it holds deliveries.
    wait_for(
        lambda: (
            external.started_events[f"{prefix}/patient"].is_set()
            and any(c.path == f"{prefix}/a" and c.headers.get("x-test-worker") == victim.name for c in external.calls)
        ),
        60,
        "the victim at work, slow calls in flight",
    )
    victim.kill()  # its connection closes: RabbitMQ puts back what it held, unacknowledged
    external.delay(f"{prefix}/patient", 0)
    _assert_done_once(ids, prefix, ["a", "patient", "c"], external)
    _assert_no_live_worker_repeated_a_call(external, prefix)
    _assert_alive([survivor])


def test_rabbitmq_restarted_and_connections_cut_mid_run(hub) -> None:
    backend, external, workdir = hub
    assert backend.rabbit is not None
    prefix = f"/rcut-{uuid.uuid4().hex[:6]}"
    external.delay(f"{prefix}/b", 0.2)  # calls in flight, deliveries held unacknowledged, when the fault comes
    workers = _workers(backend, workdir, 2)
    ids: list[int] = []
    for fault in ("restart", "close"):
        ids += _submit("test.flow", prefix, 8)
        made = external.count()
        wait_for(lambda: external.count() >= made + 3, 60, "calls under way before the fault")  # noqa: B023
        if fault == "restart":
            backend.rabbit.restart_app(down=1.0)  # durable queues, persistent messages: kept
        else:
            backend.rabbit.ctl("close_all_connections", "openhub test: cut from the server side")
    _assert_done_once(ids, prefix, ["a", "b", "c"], external)
    _assert_no_successful_call_repeated(external, prefix)
    _assert_alive(workers)


def test_a_delivery_taken_back_by_consumer_timeout_runs_no_call_twice(hub) -> None:
    """RabbitMQ's consumer_timeout shorter than a step (a worker told a longer one, which is why a worker
    refuses to start with a step longer than OPENHUB_CONSUMER_TIMEOUT): RabbitMQ closes the channel and
    requeues the deliveries while their steps run, and Celery takes the closed channel (406
    PRECONDITION_FAILED) for an unrecoverable error: the worker finishes the steps it runs and exits. The
    worker started in its place (systemd, Kubernetes) takes the requeued deliveries; the steps already
    recorded are not run again."""
    backend, external, workdir = hub
    assert backend.rabbit is not None
    prefix = f"/rtimeout-{uuid.uuid4().hex[:6]}"
    backend.rabbit.ctl("eval", "application:set_env(rabbit, consumer_timeout, 2000).")  # for channels opened now
    try:
        first = _workers(backend, workdir, 1)[0]
        external.delay(f"{prefix}/patient", 5.0)  # past the 2 s (checked every second)
        ids = _submit("test.long", prefix, 2)
        wait_for(lambda: first.process is not None and first.process.poll() is not None, 90, "the worker to exit")
        assert "PRECONDITION_FAILED - delivery acknowledgement on channel" in first.log()
        backend.rabbit.ctl("eval", "application:set_env(rabbit, consumer_timeout, 3600000).")
        external.delay(f"{prefix}/patient", 0)
        again = Worker(backend.env, workdir / "again", beat=True, concurrency=2).start()
        backend.workers.append(again)
        _assert_done_once(ids, prefix, ["a", "patient", "c"], external)
        _assert_no_live_worker_repeated_a_call(external, prefix)
        _assert_alive([again])
    finally:
        backend.rabbit.ctl("eval", "application:set_env(rabbit, consumer_timeout, 3600000).")


def test_publishes_rabbitmq_refuses_leave_the_messages_due_for_the_poller(hub) -> None:
    """A queue at its length limit with `overflow: reject-publish` nacks every publish: with publisher
    confirms the publish fails, the message stays in the store, and the poller publishes it once the
    queue takes messages again."""
    backend, external, workdir = hub
    assert backend.rabbit is not None
    prefix = f"/rnack-{uuid.uuid4().hex[:6]}"
    backend.rabbit.ctl(
        "set_policy", "--apply-to", "queues", "full", "^openhub$", '{"max-length": 0, "overflow": "reject-publish"}'
    )
    try:
        ids = _submit("test.flow", prefix, 6)
        assert [openhub.get_message(i).state for i in ids] == ["NEW"] * 6
        assert backend.rabbit.queue_depths().get("openhub", (0, 0))[0] == 0  # nothing was taken
    finally:
        backend.rabbit.ctl("clear_policy", "full")
    _workers(backend, workdir, 1)
    _assert_done_once(ids, prefix, ["a", "b", "c"], external)
    _assert_no_successful_call_repeated(external, prefix)
