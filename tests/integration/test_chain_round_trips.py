"""Chain mode on PostgreSQL: a hop's entry and its step's outcome in ONE statement that is its own
transaction (issue 42 item 3, `store.db.single_statement`: no BEGIN or COMMIT round trip), with the same
compare-and-set; where that statement writes nothing (a retry) the step is entered in a transaction as before.
SQLite has no round trips to save: it keeps its transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, select

from openhub.store import db
from openhub.store.schema import ext_calls, transitions
from openhub.testing import LocalHub

ROUTES = "tests.support.hop_routes"


@pytest.fixture(scope="module")
def hub(local_store: str) -> Iterator[LocalHub]:
    # One hub for the module: LocalHub's default correlation ids (local-1, ...) restart with each hub, so a
    # second hub's submits on the same store would be duplicates of the first's.
    with LocalHub(ROUTES, OPENHUB_DATABASE_URL=local_store) as local:
        yield local


@contextmanager
def sent(url: str) -> Iterator[list[tuple[bool, str]]]:
    """Every statement this process sends to `url` meanwhile, but the reads of the database's clock: whether
    it ran in autocommit (its own transaction, no BEGIN), and the statement."""
    statements: list[tuple[bool, str]] = []

    def executed(conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
        if "clock_timestamp" not in statement:
            statements.append((conn.connection.dbapi_connection.autocommit, statement))

    engine = db.get_engine(url)
    event.listen(engine, "before_cursor_execute", executed)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", executed)


def test_a_chain_enters_and_hands_on_each_hop_in_one_statement_of_its_own(hub: LocalHub, local_store: str) -> None:
    message = hub.submit("hops.flow", {})
    with sent(local_store) as statements:
        hub.run()
    assert hub.get(message.id).state == "OK"
    # The claim (as a batch's), step one's outcome, step two's lease, its outcome, step three's lease, and
    # its outcome, which ends the message (nobody to tell: no confirmer, parent, funnel or hook).
    alone = [" ".join(s.split()[:3]) for autocommit, s in statements if autocommit]
    assert alone == ["WITH v AS", "WITH keep AS", "WITH lease AS", "WITH keep AS", "WITH lease AS", "WITH keep AS"]
    assert [s for autocommit, s in statements if not autocommit and "messages" in s] == []
    with db.reading(local_store) as conn:
        history = conn.execute(
            select(transitions.c.event).where(transitions.c.message_id == message.id).order_by(transitions.c.id)
        ).scalars()
        assert list(history) == ["accepted", "claimed", "step_ok", "step_ok", "step_ok", "completed"]
        calls = conn.execute(select(ext_calls.c.attempts).where(ext_calls.c.message_id == message.id)).scalars()
        assert list(calls) == [1, 1, 1]


def test_a_retry_enters_its_steps_in_a_transaction_and_calls_the_failed_one_again(
    hub: LocalHub, local_store: str
) -> None:
    message = hub.submit("hops.flow", {"fail_two": True})
    hub.run()  # step two fails; its retry (step one done, step two's call record there, FAILED) is due soon
    hub.tick(seconds=5)
    assert hub.get(message.id).state == "OK"
    with db.reading(local_store) as conn:
        calls = conn.execute(
            select(ext_calls.c.step_key, ext_calls.c.attempts, ext_calls.c.state)
            .where(ext_calls.c.message_id == message.id)
            .order_by(ext_calls.c.id)
        ).all()
    assert [tuple(c) for c in calls] == [("one", 1, "OK"), ("two", 2, "OK"), ("three", 1, "OK")]
