"""Redis restarted empty under load (Redis + PostgreSQL, real workers on prefork and gevent, a real HTTP
external system): no worker dies of it, and the chains it lost are carried on in seconds.

Issue 33, breaks 8 and 9: a restart killed workers (kombu's channel close restored the unacknowledged
deliveries through a transport whose connection was already gone: "Unrecoverable error"), and the
chains lost with the queue were published again only after OPENHUB_LEASE_GRACE (300 s).
"""

from __future__ import annotations

import pytest

from openhub.testing import ExternalSystem
from tests.chaos.test_faults import _assert_all_done_once, _hub, _submit
from tests.support.pools import POOL_OPTIONS
from tests.support.waiting import wait_for
from tests.support.workers import Worker

pytestmark = pytest.mark.chaos

RESTARTS = 10
# prefork with more processes than a worker's share of the load: it holds a delivery or two with a BRPOP
# outstanding for more, the moment a restart hurt most (the channel's close is cut short by that read).
OPTIONS = {**POOL_OPTIONS, "prefork": {"concurrency": 4}}
DOWN = 1.5  # seconds each restart keeps Redis away: workers notice it, with deliveries in hand


def _assert_no_successful_call_repeated(external: ExternalSystem) -> None:
    replays = [(c.path, c.key) for c in external.calls if c.replay]
    assert not replays, f"successful calls made again: {replays[:10]}"


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_redis_restarted_empty_ten_times_under_load_kills_no_worker(pool, tmp_path) -> None:  # noqa: ANN001
    with _hub(tmp_path) as (backend, external, _pg):
        assert backend.redis is not None
        prefix = f"/restart-{pool}"
        external.delay(f"{prefix}/b", 0.2)  # calls in flight, deliveries held unacknowledged, when Redis goes
        workers = [Worker(backend.env, tmp_path / f"w{n}", beat=n == 0, **OPTIONS[pool]).start() for n in range(3)]
        backend.workers += workers
        ids: list[int] = []
        for _ in range(RESTARTS):
            ids += _submit("test.flow", prefix, 12)
            made = external.count()
            wait_for(lambda: external.count() >= made + 3, 60, "calls under way before the restart")  # noqa: B023
            backend.redis.restart(down=DOWN)
        _assert_all_done_once(ids, prefix, ["a", "b", "c"], external)
        _assert_no_successful_call_repeated(external)
        exited = [(w.name, w.process.returncode, w.log()[-3000:]) for w in workers
                  if w.process is not None and w.process.poll() is not None]
        assert not exited, exited
