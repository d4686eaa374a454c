"""The proof before an external call (openhub.store.proof, issue 33 break 6): a store that answered this
process's statement within PROOF_AGE, or answers a ping now; a ping on a cut link is given up in time; one
ping in flight per process."""

from __future__ import annotations

import threading
import time

import sqlalchemy
from sqlalchemy import create_engine, text

from openhub.store import db, proof
from tests.support.tcpproxy import TcpProxy


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
