"""A worker whose wall clock is off (issue 22, found by the multi-host rig of tests/support/hosts.py).

The lease's time is written by the worker's clock, the heartbeat's by the database's (on SQLite, the
host's). A worker 90 s behind seemed to have left a run begun since its last heartbeat out of it (its
task crashed), and a poller tick in between repaired the run while its step called: the call was made
again. LocalHub runs the step with its clock 90 s behind; the step's hook is the poller's tick.
"""

from __future__ import annotations

from typing import Any

import pytest

from openhub.engine.poller import tick
from tests.support import promise_routes as routes


@pytest.mark.parametrize("skew", [-90, 90])
def test_a_poller_tick_while_a_skewed_worker_calls_repairs_nothing(skew: int) -> None:
    with routes.local_hub() as hub:
        repaired = []
        routes.HOOKS["first"] = lambda ctx: repaired.append(tick(hub.hub).repaired)  # mid-call, on the right clock
        view = hub.submit("p.flow", {})
        hub.run(seconds=skew)
        hub.run(seconds=skew)  # a repair would have re-driven the message: run what it published
        assert repaired == [0]
        assert routes.calls("first") == 1
        assert hub.get(view.id).failed_count == 0


def test_a_confirmation_sent_by_a_sender_whose_clock_is_behind_is_not_sent_again(tmp_path) -> None:
    # Found by bench/hosts_soak.py: a confirmation's sending lease was written on the sender's clock;
    # 90 s behind, it was over at once for another sender, which sent the confirmation again meanwhile.
    import threading
    from datetime import timedelta

    import openhub
    from openhub.core.config import get_settings
    from openhub.core.registry import get_registry
    from openhub.outbound.confirm import queue_confirmation, send_confirmations
    from openhub.store.db import utcnow
    from openhub.testing import ExternalSystem
    from tests.support import backends
    from tests.support.process_store import transaction
    from tests.support.waiting import wait_for

    external = ExternalSystem().start()
    try:
        with backends.backend("redis-pg", tmp_path, {"OPENHUB_TEST_EXTERNAL_URL": external.url}):
            external.delay("/cs/confirm", 2.0)
            view = openhub.submit("test.flow", {"prefix": "/cs"}, source_system="CONFIRMED", correlation_id="cs-1")
            with transaction() as conn:
                queue_confirmation(conn, view.id, "OK", utcnow() - timedelta(seconds=120))  # due for both
            hub = {"settings": get_settings(), "registry": get_registry()}  # the process's (the backend's)
            behind = threading.Thread(
                target=send_confirmations, args=(view.id, utcnow() - timedelta(seconds=90)), kwargs=hub
            )
            behind.start()
            wait_for(lambda: external.started_events["/cs/confirm"].is_set(), 30, "the first sender's call")
            send_confirmations(view.id, **hub)  # another sender, on the right clock, while the first one sends
            behind.join(timeout=30)
            assert external.count("/cs/confirm") == 1
    finally:
        external.stop()


def test_a_message_taken_in_by_a_host_whose_clock_is_behind_keeps_its_place_in_guaranteed_order(local_store) -> None:
    # Found by bench/hosts_soak.py (seed 7): a message the source gave no timestamp was stamped with the
    # ingress host's clock; taken in later through an API host 90 s behind, it sorted before the earlier
    # one and its guaranteed-order funnel called it first. The API's batcher prepares items with its
    # host's time, as here; on PostgreSQL the store stamps them with the database's clock.
    from datetime import timedelta

    from openhub.service.messages import prepare_item, store_new
    from openhub.store.db import utcnow

    with routes.local_hub(OPENHUB_DATABASE_URL=local_store) as hub:
        called: list[str] = []
        routes.HOOKS["first"] = lambda ctx: called.append(ctx.message.correlation_id)

        def submit(correlation_id: str, skew: float) -> Any:
            item = dict(
                route="p.ordered", payload={"group": "g"}, source_system="CONFIRMED", correlation_id=correlation_id
            )
            return store_new([prepare_item(item, utcnow() + timedelta(seconds=skew))])[0]

        earlier, later = submit("on-time", 0), submit("behind", -90)
        assert later.msg_timestamp >= earlier.msg_timestamp
        hub.publisher.chains.reverse()  # the later message's chain is delivered first: it must wait
        hub.run()
        hub.tick(seconds=1)
        assert called == ["on-time", "behind"]
        assert [hub.get(v.id).state for v in (earlier, later)] == ["OK", "OK"]


@pytest.mark.parametrize("holder, taker", [(0, 90), (-90, 0)])
def test_a_duplicate_task_on_a_skewed_clock_does_not_take_a_lease_still_running(
    local_store, holder: int, taker: int
) -> None:
    # The same task delivered twice while its run calls out (an orphaned delivery handed back while its
    # stalled worker lived on): the second took the step lease where its due time had passed on its own
    # clock, a lease written on the holder's. 90 s apart with the rig's leases (20 s + 4 s, or the grace
    # alone once the poller extended it), the second run made the call again beside the first.

    with routes.local_hub(OPENHUB_DATABASE_URL=local_store, OPENHUB_STEP_TIMEOUT="20", OPENHUB_LEASE_GRACE="4") as hub:
        duplicate: list[int] = []

        def deliver_again(ctx: Any) -> None:  # mid-call: the duplicate runs, on the taker's clock
            if not duplicate:
                duplicate.append(0)
                duplicate[0] = hub.run(seconds=taker)

        routes.HOOKS["first"] = deliver_again
        view = hub.submit("p.flow", {})
        hub.publisher.chains.append(hub.publisher.chains[0])  # the same chain, the same token
        hub.run(seconds=holder)
        assert duplicate == [1]
        assert routes.calls("first") == 1 and routes.MOST["first"] == 1
        assert routes.calls("second") == 1
        assert hub.get(view.id).state == "OK"


def test_a_poller_whose_clock_is_behind_sends_again_a_confirmation_whose_sending_lease_ended(local_store) -> None:
    # Review of issue 22: a sending lease is written and ended on the database's clock, but the poller
    # picked the confirmations to send by its own: 90 s behind, it left a crashed sender's confirmation
    # unsent for 90 s more than its lease.
    from datetime import timedelta

    from sqlalchemy import update

    from openhub.outbound.confirm import queue_confirmation, send_confirmations
    from openhub.store.db import database_now, utcnow
    from openhub.store.schema import confirmations
    from tests.support.process_store import transaction

    with routes.local_hub(OPENHUB_DATABASE_URL=local_store) as hub:
        view = hub.submit("p.flow", {})
        with transaction() as conn:  # a sender claimed it and crashed; its lease ended a second ago
            queue_confirmation(conn, view.id, "OK", utcnow())
            conn.execute(
                update(confirmations).values(
                    state="SENDING", claim="crashed", due_at=database_now() - timedelta(seconds=1)
                )
            )
        sender = {"settings": hub.hub.settings, "registry": hub.hub.registry}
        assert send_confirmations(view.id, now=utcnow() - timedelta(seconds=90), **sender) == 1
        assert routes.CONFIRMED == [(view.id, "OK")]


def test_the_skewed_clock_takes_a_datetime_a_driver_made(tmp_path) -> None:
    # Found by the multi-host rig once its traffic had splits (issue 33, item 6): on a skewed host every
    # split failed, "msg_timestamp must be a datetime", because its datetime was the skewed subclass and
    # the parent's timestamp, read by psycopg, the real type.
    import os
    import subprocess
    import sys

    from tests.support.hosts import SKEW_PATH
    from tests.support.workers import PROJECT

    skew = tmp_path / "skew"
    skew.write_text("90\n")
    script = (
        "import _datetime, datetime; from openhub.engine.intake import to_utc;"
        "real = _datetime.datetime(2020, 1, 1); assert to_utc(real) == real;"
        "assert datetime.datetime.now() - real.now() > datetime.timedelta(seconds=80)"
    )
    env = dict(os.environ, OPENHUB_TEST_SKEW_FILE=str(skew), PYTHONPATH=f"{SKEW_PATH}{os.pathsep}{PROJECT}")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
