"""The proof before an external call (openhub.store.proof, issue 33 break 6): a store that answered this
process's statement within PROOF_AGE, or answers a ping now; a ping on a cut link is given up in time; one
ping in flight per process."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import create_engine, select, text

import openhub
from openhub.store import db, proof
from openhub.store.db import transaction
from openhub.store.schema import messages
from openhub.testing import ExternalSystem
from tests.support.tcpproxy import TcpProxy
from tests.support.waiting import wait_for


def _through(proxy: TcpProxy, url: str) -> str:
    return sqlalchemy.engine.make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def test_a_statement_answered_is_a_proof_and_an_old_one_asks_a_ping(local_store: str) -> None:
    proxy = TcpProxy(_host_port(local_store))
    url = _through(proxy, local_store)
    engine = create_engine(url)
    db.record_proofs(engine, url)
    with engine.connect() as conn:
        before = time.monotonic()
        conn.execute(text("SELECT 1"))
    assert db.proved_since(url) >= before  # as of its sending
    made = proof.pings_made()
    assert proof.proved(url) and proof.pings_made() == made  # fresh: no ping
    db._proved[url] = time.monotonic() - proof.PROOF_AGE - 0.1  # older than the bound
    assert proof.proved(url) and proof.pings_made() == made + 1  # a ping answered
    engine.dispose()


def test_a_ping_on_a_cut_link_is_given_up_within_the_bound_and_one_is_in_flight_at_once(local_store: str) -> None:
    proxy = TcpProxy(_host_port(local_store))
    url = _through(proxy, local_store)
    assert proof.proved(url)  # its connection opened and a ping answered
    proxy.blackhole()
    db._proved[url] = time.monotonic() - proof.PROOF_AGE - 0.1
    made = proof.pings_made()
    answers: list[bool] = []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: answers.append(proof.proved(url))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    took = time.monotonic() - started
    assert answers == [False] * 8
    assert proof.pings_made() == made + 1  # the others waited for its outcome
    assert took < proof.PROOF_AGE + 1.0, took
    # A new connection through the cut hangs in its opening: given up by its own deadline.
    started = time.monotonic()
    assert not proof.proved(url)
    assert time.monotonic() - started < proof.PING_CONNECT_TIMEOUT + 1.0


def test_sqlite_asks_no_proof() -> None:
    made = proof.pings_made()
    assert proof.proved("sqlite:///nowhere/x.db") and proof.pings_made() == made


def _host_port(url: str) -> tuple[str, int]:
    u = sqlalchemy.engine.make_url(url)
    return u.host or "127.0.0.1", u.port or 5432


@pytest.mark.parametrize(
    ("pool", "route", "messages"),
    [("prefork", "test.flow", 1), ("gevent", "batched.flow", 3)],
)
def test_a_worker_cut_from_the_store_starts_no_call_past_the_proof_age(
    tmp_path: Path, pool: str, route: str, messages: int
) -> None:
    """Issue 33, break 6: a step whose lease was written just before its worker lost the store (a network
    cut: its queries hang, nothing fails) still made its call as long as the heartbeat was younger than the
    call fence (half of dead-after, 15 s here); the store never learnt of it, and the repair made it again.
    Now a call goes only within PROOF_AGE of a round trip of its process to the store: the step computes 2 s
    between its lease and its call, the ping it then asks for is not answered, and the call is refused.
    Under gevent a batch's members ask at once: one ping for them all."""
    from tests.support import backends
    from tests.support.workers import Worker

    saved = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    external = ExternalSystem().start()
    try:
        with backends.backend("redis-pg", tmp_path / "store", {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as b:
            proxy = TcpProxy(_host_port(b.database_url))
            env = dict(b.env, OPENHUB_DATABASE_URL=_through(proxy, b.database_url), OPENHUB_WORKER_DEAD_AFTER="30")
            cut_off = Worker(env, tmp_path, beat=False, concurrency=4 if pool == "gevent" else 1, pool=pool)
            try:
                cut_off.start()
                b.workers.append(cut_off)
                prefix = f"/p{uuid.uuid4().hex[:8]}"
                ids = [
                    v.id
                    for v in openhub.submit_many(
                        [
                            {
                                "route": route,
                                "payload": {"prefix": prefix, "n": n, "script": {"a": {"pause": 2.0}}},
                                "source_system": "CRM",
                                "correlation_id": f"proof-{uuid.uuid4().hex}",
                            }
                            for n in range(messages)
                        ]
                    )
                ]
                wait_for(lambda: _leased(b.database_url, ids) == messages, 60, "every step a leased")
                proxy.blackhole()
                cut = time.monotonic()
                wait_for(
                    lambda: cut_off.log().count("call not made") >= messages or external.count(f"{prefix}/a") > 0,
                    30,
                    "step a's calls refused (or made)",
                )
                late = [
                    round(c.started - cut, 3)
                    for c in external.calls
                    if c.path == f"{prefix}/a" and c.started > cut + proof.PROOF_AGE + 0.25
                ]
                assert late == [], (late, cut_off.log()[-3000:])
            finally:
                cut_off.kill()
        backends.activate(saved)
    finally:
        external.stop()


def _leased(url: str, ids: list[int]) -> int:
    with transaction(url) as conn:
        rows = conn.execute(select(messages.c.step_run).where(messages.c.id.in_(ids))).scalars().all()
    return sum(1 for r in rows if r is not None)


def test_a_ping_connection_the_server_closed_is_opened_anew_not_taken_for_a_cut(local_store: str) -> None:
    url = local_store
    db._proved[url] = time.monotonic() - proof.PROOF_AGE - 0.1
    assert proof.proved(url)  # the ping's connection opened
    backend = proof._pings[url].pg.backend_pid
    with create_engine(url).connect() as conn:  # an idle timeout, a restart: the server ends the session
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        conn.commit()
    db._proved[url] = time.monotonic() - proof.PROOF_AGE - 0.1
    made = proof.pings_made()
    assert proof.proved(url)
    assert proof.pings_made() == made + 2 and proof._pings[url].pg.backend_pid != backend
