"""A live worker on a box loaded at ten times its cores is never judged dead and keeps taking work
(issue 33, break 5: under gevent the heartbeat was a greenlet, and on a loaded machine it fell behind,
the worker was judged dead, its calls were made again and it stopped taking tasks).

CPU burners (tests/support/burner.py's spinners, at the worker's priority) hold every core while two
gevent workers carry waves of messages; each wave must reach OK with each call made once per
idempotency key and no run repaired as lost with its worker.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

import openhub
from openhub.store.schema import transitions
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.burner import spin
from tests.support.process_store import transaction
from tests.support.waiting import wait_final
from tests.support.workers import Beat, Worker

pytestmark = pytest.mark.chaos
pytest.importorskip("gevent")

LOAD = 10  # burners per core
WAVES, PER_WAVE = 3, 10


def test_a_live_gevent_worker_on_a_loaded_box_is_never_judged_dead(tmp_path: Path) -> None:
    saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    external = ExternalSystem().start()
    try:
        # Dead after 5 s: the fence at 3.75 s, a call refused at 2.5 s of heartbeat silence; on a box this
        # loaded a heartbeat a greenlet carried fell that far behind.
        with backends.backend(
            "redis-pg",
            tmp_path / "store",
            {"OPENHUB_TEST_EXTERNAL_URL": external.url, "OPENHUB_WORKER_DEAD_AFTER": "5"},
        ) as b:
            workers = [Worker(b.env, tmp_path, beat=False, concurrency=50, pool="gevent") for _ in range(2)]
            beat = Beat(b.env, tmp_path)
            try:
                for w in workers:
                    w.start(timeout=120)
                    b.workers.append(w)
                beat.start()
                _carry_waves_under_load(external, workers)
            finally:
                beat.stop()
                for w in workers:
                    w.stop()
        backends.activate(saved)
    finally:
        external.stop()


def _carry_waves_under_load(external: ExternalSystem, workers: list[Worker]) -> None:
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(LOAD * (os.cpu_count() or 1))]
    for p in spinners:
        p.start()
    try:
        ids: list[int] = []
        for _ in range(WAVES):
            prefix = f"/l{uuid.uuid4().hex[:8]}"
            external.delay(f"{prefix}/a", 0.2)
            wave = [
                v.id
                for v in openhub.submit_many(
                    [
                        {
                            "route": "test.flow",
                            "payload": {"prefix": prefix},
                            "source_system": "CRM",
                            "correlation_id": f"load-{uuid.uuid4().hex}",
                        }
                        for _ in range(PER_WAVE)
                    ]
                )
            ]
            views = [wait_final(i, timeout=150) for i in wave]
            assert [v.state for v in views] == ["OK"] * PER_WAVE, views
            ids += wave
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.join()
    twice = {k: n for k, n in Counter((c.path, c.key) for c in external.calls).items() if n > 1}
    assert not twice, f"calls made more than once: {twice}"
    with transaction() as conn:
        lost = list(
            conn.execute(
                select(transitions.c.message_id, transitions.c.detail).where(transitions.c.event == "lease_expired")
            )
        )
    assert not lost, f"runs of a live worker repaired as lost: {lost}"
    for w in workers:
        assert "died" not in w.log(), w.log()[-3000:]
