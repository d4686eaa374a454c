"""A worker whose wall clock is off (issue 22, found by the multi-host rig of tests/support/hosts.py).

The lease's time is written by the worker's clock, the heartbeat's by the database's (on SQLite, the
host's). A worker 90 s behind seemed to have left a run begun since its last heartbeat out of it (its
task crashed), and a poller tick in between repaired the run while its step called: the call was made
again. LocalHub runs the step with its clock 90 s behind; the step's hook is the poller's tick.
"""

from __future__ import annotations

import pytest

from openhub.poller import tick
from tests.support import promise_routes as routes


@pytest.mark.parametrize("skew", [-90, 90])
def test_a_poller_tick_while_a_skewed_worker_calls_repairs_nothing(skew: int) -> None:
    with routes.local_hub() as hub:
        repaired = []
        routes.HOOKS["first"] = lambda ctx: repaired.append(tick().repaired)  # mid-call, on the right clock
        view = hub.submit("p.flow", {})
        hub.run(seconds=skew)
        hub.run(seconds=skew)  # a repair would have re-driven the message: run what it published
        assert repaired == [0]
        assert routes.calls("first") == 1
        assert hub.get(view.id).failed_count == 0
