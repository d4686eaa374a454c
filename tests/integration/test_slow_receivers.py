"""A slow webhook or confirmer must not hold the hub (issue 27): a receiver that sends its headers
and then one byte every so often is cut off at the send's overall deadline (OPENHUB_CONFIRM_TIMEOUT),
the send is retried later, and one poller tick stops sending once its time budget is spent."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Iterator

import httpx
import pytest

import openhub
from openhub.outbound.notify import post_within
from openhub.testing import LocalHub
from tests.support import backends
from tests.support import promise_routes as routes
from tests.support.pools import POOL_OPTIONS, POOLS
from tests.support.workers import PROJECT


class DribblingServer:
    """A real HTTP server that answers 200 with its headers at once, then one body byte every `pause` s."""

    def __init__(self, pause: float = 0.5, length: int = 200) -> None:
        self.pause, self.length = pause, length
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/hook-{uuid.uuid4().hex[:6]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)  # the request (small: one JSON body)
            self.requests += 1
            try:
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {self.length}\r\n\r\n".encode())
                for _ in range(self.length):
                    if self._stop.wait(self.pause):
                        return
                    conn.sendall(b"x")
            except OSError:  # the client gave up: what the deadline is for
                return

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture(params=["embedded", "redis-pg"])
def own_backend(request: pytest.FixtureRequest, tmp_path, external) -> Iterator[backends.Backend]:
    """A store and broker of this test's own: the session's worker (which other tests start, with its
    beat) would take the step tasks and send the confirmations too, and be held by the slow receiver."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    with backends.backend(request.param, tmp_path / "store", {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as b:
        yield b
    backends.activate(saved)


@pytest.fixture
def slow() -> Iterator[DribblingServer]:
    server = DribblingServer()
    yield server
    server.close()


def test_a_send_ends_at_its_overall_deadline(slow: DribblingServer) -> None:
    started = time.monotonic()
    with pytest.raises(httpx.TimeoutException, match="2.0 s"):
        post_within(slow.url, 2.0, json={"x": 1})
    elapsed = time.monotonic() - started
    # Per read it never waited longer than 0.5 s: the cap is overall (the receiver dribbles for 100 s). The
    # upper bound is sized for a busy machine, far from the 100 s a per-read cap would take.
    assert 1.9 <= elapsed < 30, elapsed


def test_a_slow_webhook_is_cut_off_retried_and_a_tick_keeps_to_its_budget(slow: DribblingServer) -> None:
    routes.reset()
    with LocalHub(
        "tests.support.promise_routes",
        source_system="CONFIRMED",
        OPENHUB_WEBHOOK_URL=slow.url,
        OPENHUB_WEBHOOK_STATES="FAILED",
        OPENHUB_CONFIRM_TIMEOUT="1",
        OPENHUB_POLL_INTERVAL="0.5",
        OPENHUB_CONFIRM_MAX_FAILS="5",
        OPENHUB_CONFIRM_INTERVAL="60",
    ) as hub:  # not a test backend's 0.3 s
        ids = [hub.submit("p.reserve", {"raise": "out_of_stock"}).id for _ in range(3)]  # fatal: FAILED at once
        started = time.monotonic()
        hub.run()
        hub.tick()
        assert time.monotonic() - started < 30  # each send cut off at 1 s, not after 100 s of dribble (busy: < 30)
        rows = [r for r in openhub.list_confirmations() if r["hook"] == "webhook"]
        assert len(rows) == 3 and {r["state"] for r in rows} == {"FAILED"}, rows
        assert all("Timeout" in r["last_error"] and "1.0 s" in r["last_error"] for r in rows)
        before = slow.requests
        # All three are due again; the tick's budget (0.5 s, half a send cut off at 1 s) is spent after the first.
        hub.tick(seconds=61)
        assert slow.requests == before + 1  # one send, however long a busy machine took over it
        retried = [r for r in openhub.list_confirmations() if r["hook"] == "webhook" and r["attempts"] == 2]
        assert len(retried) == 1 and retried[0]["message_id"] in ids
    routes.reset()


def test_a_slow_confirmer_does_not_hold_the_step_workers(
    own_backend, slow: DribblingServer, tmp_path, prefix: str
) -> None:
    """The confirmation goes to its own task on its own queue by default (OPENHUB_CONFIRM_QUEUE,
    `openhub.confirm`), which a step worker started as deploy/Procfile's `worker` leaves to the `confirmer`:
    a one-process step worker carries the next message at once while the confirmer's receiver dribbles,
    and its poller's ticks hand the due confirmations over instead of sending them themselves.

    Issue 34 M5: the queue was the default one unless configured, and the poller sent retries inline,
    so slow receivers held the step workers for OPENHUB_CONFIRM_TIMEOUT each."""
    from openhub.outbound.confirm import HANDED_OVER
    from openhub.store.schema import confirmations
    from tests.support.process_store import transaction
    from tests.support.waiting import wait_final, wait_for
    from tests.support.workers import Worker

    base = slow.url.rsplit("/", 1)[0]  # the test routes' confirmer POSTs to {external}{prefix}/confirm
    env = dict(own_backend.env, OPENHUB_TEST_EXTERNAL_URL=base)
    assert "OPENHUB_CONFIRM_QUEUE" not in env  # the default
    own_backend.activate()
    procfile = {
        k: v.split()
        for k, v in (
            line.split(": ", 1)
            for line in (PROJECT / "deploy" / "Procfile").read_text().splitlines()
            if line and not line.startswith("#")
        )
    }
    excluded = procfile["worker"][procfile["worker"].index("--exclude-queues") + 1]
    served = procfile["confirmer"][procfile["confirmer"].index("--queues") + 1]
    assert excluded == served == "openhub.confirm"
    steps = Worker(env, tmp_path, beat=True, concurrency=1, exclude_queues=excluded).start()
    confirmer = None
    try:
        first = openhub.submit(
            "test.badsplit", {"prefix": prefix}, source_system="CONFIRMED", correlation_id=uuid.uuid4().hex
        )
        wait_final(first.id)
        second = openhub.submit(
            "test.badsplit", {"prefix": prefix}, source_system="CONFIRMED", correlation_id=uuid.uuid4().hex
        )
        wait_final(second.id, timeout=60)  # not behind a confirmation that dribbles for 100 s

        def handed_over() -> bool:  # by the poller's tick, to a task on the confirm queue
            with transaction() as conn:
                claims = {r.claim for r in conn.execute(confirmations.select())}
            return claims == {HANDED_OVER}

        wait_for(handed_over, timeout=60, what="the poller's tick to hand the due confirmations over")
        assert slow.requests == 0  # neither the step task nor the tick sent one itself
        confirmer = Worker(env, tmp_path, beat=False, concurrency=1, queues=served).start()
        wait_for(
            lambda: slow.requests >= 1,
            timeout=30,  # the confirm worker sends them
            what=lambda: f"the confirmer's POST; confirm worker log: {confirmer.log()[-3000:]}",
        )
    finally:
        steps.stop()
        if confirmer is not None:
            confirmer.kill()  # its send dribbles on for OPENHUB_CONFIRM_TIMEOUT: a warm shutdown would wait


# A confirmation's sending lease of 2 s (policy.confirmation_lease): short enough for a test to outlast it,
# long enough that a loaded machine's scheduling never holds its renewals (every 0.4 s) back that long.
SHORT_LEASE = {"OPENHUB_CONFIRM_TIMEOUT": "1", "OPENHUB_STEP_TIMEOUT": "2", "OPENHUB_CONFIRM_INTERVAL": "2"}


@pytest.mark.parametrize("hook", ["confirm", "alert"], ids=["confirmer", "state-hook"])
def test_a_confirmer_that_outlasts_its_lease_is_called_once_while_ticks_go_on(
    local_store_env: dict[str, str], hook: str
) -> None:
    """A custom confirmer (or @on_state hook) that blocks three times its sending lease, while poller ticks
    go on beside it: the lease is renewed while it runs, so no tick takes the confirmation over and calls
    it a second time (on main every tick after the lease's end did, with the same delivery id)."""
    from tests.support.waiting import wait_for

    lease = 2.0  # SHORT_LEASE: max(confirm interval, step timeout, 2 x confirm timeout)
    calls: list[tuple[int | None, str]] = []
    ticks: list[int] = []
    release = threading.Event()

    def blocks_first_time(outcome) -> None:
        calls.append((outcome.delivery_id, outcome.state))
        if len(calls) == 1:
            release.wait(60)  # the confirmer's own slowness, ended by the test

    with routes.local_hub(**SHORT_LEASE, **local_store_env) as hub:
        routes.HOOKS[hook] = blocks_first_time
        view = hub.submit("p.reserve", {"raise": "out_of_stock"})  # FAILED at once: confirmed, and the hook told
        sender = threading.Thread(target=hub.run, name="sender")  # sends both right after the final state
        sender.start()
        try:
            wait_for(lambda: calls, 30, "the confirmer to be called")
            until = time.monotonic() + 3 * lease

            def ticked_past_the_lease() -> bool:
                # The poller beside the blocked send, at wait_for's pace (20 ticks a second). A tight loop of
                # ticks would hold SQLite's one write lock nearly all the time, and the renewal, like any
                # other writer of the store, would wait its turn longer than this test's 2 s lease.
                hub.tick()
                ticks.append(1)
                return time.monotonic() >= until and len(ticks) >= 3

            wait_for(ticked_past_the_lease, 30, "ticks beside the blocked send for three of its leases")
        finally:
            release.set()
            sender.join(30)
        hub.tick()
        assert len(calls) == 1, f"called again while it still ran (after {len(ticks)} ticks): {calls}"
        rows = openhub.list_confirmations(message_id=view.id)  # the confirmation and the hook's notification
        assert [(r["state"], r["attempts"]) for r in rows] == [("OK", 1), ("OK", 1)], rows
        assert (view.id, "FAILED") in (routes.CONFIRMED if hook == "confirm" else routes.NOTIFIED)


@pytest.mark.parametrize("pool", POOLS)
def test_a_confirmer_past_its_deadline_is_cut_off_and_sent_again_later(
    own_backend: backends.Backend, pool: str, tmp_path, prefix: str, external
) -> None:
    """In a worker (SIGALRM in a prefork task's process, a gevent.Timeout in a greenlet) a custom confirmer
    whose receiver takes longer than OPENHUB_CONFIRM_TIMEOUT is interrupted there: the send failed, and is
    tried again later with the same delivery id, never beside the one cut off."""
    from tests.support.waiting import wait_final, wait_for
    from tests.support.workers import Worker

    env = dict(own_backend.env, OPENHUB_CONFIRM_TIMEOUT="1", OPENHUB_CONFIRM_INTERVAL="1")
    own_backend.activate()
    worker = Worker(env, tmp_path, **POOL_OPTIONS[pool]).start()
    try:
        external.delay(f"{prefix}/confirm", 4)  # answers after 4 s, within the confirmer's own 10 s read timeout
        m = openhub.submit("test.flow", {"prefix": prefix}, source_system="CONFIRMED", correlation_id=uuid.uuid4().hex)
        assert wait_final(m.id).state == "OK"

        def first_attempt_failed() -> list:
            return [r for r in openhub.list_confirmations(message_id=m.id) if r["attempts"] >= 1]

        # A sender may decline to call (its heartbeat fell behind on a loaded box: the fence) and leave the row
        # SENDING to the next one, after a sending lease (stop 45's CI waited 30 s in all).
        from openhub.core.config import Settings
        from openhub.core.policy import confirmation_lease

        lease = confirmation_lease(Settings.from_env(env)).total_seconds()
        (row,) = wait_for(
            first_attempt_failed,
            lease + 30,
            lambda: (
                f"the first send to end ({openhub.list_confirmations(message_id=m.id)}); "
                f"worker log: {worker.log()[-5000:]}"
            ),
        )
        assert row["state"] == "FAILED" and "the confirmer ran over its timeout of 1 s" in row["last_error"], row
        external.delay(f"{prefix}/confirm", 0)
        wait_for(
            lambda: [r for r in openhub.list_confirmations(message_id=m.id) if r["state"] == "OK"],
            lease + 30,
            "the confirmation to be sent again",
        )
        sends = sorted((c.started, c.ended) for c in external.calls if c.path == f"{prefix}/confirm")
        assert all(later[0] >= earlier[0] + 1 for earlier, later in zip(sends, sends[1:])), sends
    finally:
        external.delay(f"{prefix}/confirm", 0)
        worker.stop()


def test_a_sender_that_stalled_after_its_claim_does_not_call_beside_the_one_that_took_over(
    local_store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender stalls (its renewals with it, as a SIGSTOPped process's) between its claim and its call,
    longer than the lease: a tick takes the confirmation over and sends it. The stalled sender, resumed,
    must not call as well: its lease, as last renewed, has run out (`_Sending.held`)."""
    from openhub.outbound import confirm
    from tests.support.waiting import wait_for

    stalled, resume = threading.Event(), threading.Event()

    held = confirm._Sending.held

    def stalls_once_in_the_sender(sending):  # after its claim, before it asks whether its lease still holds
        if threading.current_thread().name == "sender" and not stalled.is_set():
            stalled.set()
            resume.wait(60)
        return held(sending)

    monkeypatch.setattr(confirm._Sending, "held", stalls_once_in_the_sender)
    monkeypatch.setattr(confirm._Sending, "_renew", lambda self: None)  # stalled: no renewal either

    def both_sent() -> bool:
        hub.tick()
        return [r["state"] for r in openhub.list_confirmations(message_id=view.id)] == ["OK", "OK"]

    with routes.local_hub(**SHORT_LEASE, **local_store_env) as hub:
        view = hub.submit("p.reserve", {"raise": "out_of_stock"})  # FAILED at once: confirmed, and the hook told
        sender = threading.Thread(target=hub.run, name="sender")
        sender.start()
        try:
            wait_for(stalled.is_set, 30, "the sender to stall")
            wait_for(both_sent, 30, "a tick to take the stalled confirmation over once its lease ran out")
        finally:
            resume.set()
            sender.join(30)
        hub.tick()
        assert routes.CONFIRMED == [(view.id, "FAILED")] and routes.NOTIFIED == [(view.id, "FAILED")], (
            routes.CONFIRMED,
            routes.NOTIFIED,
        )
