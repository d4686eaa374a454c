"""Submit inside the caller's transaction (`openhub.submit(..., connection=...)`, issue 37 part 1) with real
workers on both backends: the message exists if and only if the caller's row does, is published after the
caller's commit, and by the poller when the submitting process died between the commit and the publish."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

import openhub
from openhub.core.errors import InputError
from openhub.store.schema import messages, transitions
from tests.support import backends
from tests.support.caller import ORDERS, orders_engine, psycopg_connection
from tests.support.process_store import transaction
from tests.support.waiting import wait_final, wait_for

pytestmark = pytest.mark.usefixtures("hub")
M = messages.c


@pytest.fixture
def engine(hub: backends.Backend):
    """The caller's own engine on the hub's database, with its table of orders."""
    with orders_engine(hub.database_url) as engine:
        yield engine


def _message(correlation_id: str) -> list[openhub.MessageView]:
    return openhub.list_messages(correlation_id=correlation_id, source_system="CALLER")


def _orders(prefix: str) -> set[str]:
    with transaction() as conn:
        return set(conn.execute(select(ORDERS.c.id).where(ORDERS.c.id.like(f"{prefix}-%"))).scalars())


def _submit(connection, prefix: str, order: str) -> openhub.MessageView:
    return openhub.submit(
        "test.flow",
        {"prefix": f"{prefix}/{order}"},
        source_system="CALLER",
        correlation_id=order,
        connection=connection,
    )


def _kinds(hub: backends.Backend) -> list[str]:
    return ["connection", "session"] + (["psycopg"] if hub.name == "redis-pg" else [])


def test_a_rollback_leaves_no_message_and_no_call_and_a_commit_runs_it(hub, engine, prefix, external) -> None:
    for kind in _kinds(hub):
        rolled, committed = f"{prefix}-{kind}-rolled", f"{prefix}-{kind}-kept"
        for order, commit in ((rolled, False), (committed, True)):
            if kind == "psycopg":
                raw = psycopg_connection(hub.database_url)
                with raw.cursor() as cur:
                    cur.execute("INSERT INTO caller_orders (id) VALUES (%s)", (order,))
                view = _submit(raw, prefix, order)
                raw.commit() if commit else raw.rollback()
                raw.close()
            elif kind == "session":
                with Session(engine) as session:
                    session.execute(sa.insert(ORDERS).values(id=order))
                    view = _submit(session, prefix, order)
                    session.commit() if commit else session.rollback()
            else:
                with engine.connect() as conn:
                    conn.execute(sa.insert(ORDERS).values(id=order))
                    view = _submit(conn, prefix, order)
                    conn.commit() if commit else conn.rollback()
            assert view.state == "NEW" and not view.duplicate
        done = wait_final(_message(committed)[0].id)
        assert done.state == "OK", (kind, done.state, done.failed_error)
        assert [external.count(f"{prefix}/{committed}/{s}") for s in "abc"] == [1, 1, 1]
        # The committed message, submitted after the rolled-back one, is done: nothing of the other is left.
        assert _message(rolled) == [] and external.count(f"{prefix}/{rolled}/a") == 0, kind
        assert _orders(prefix) >= {committed} and rolled not in _orders(prefix)


def test_a_connection_on_another_database_or_in_autocommit_is_refused(hub, tmp_path) -> None:
    other = sa.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    with other.connect() as conn, pytest.raises(InputError, match="not on the hub's database"):
        _submit(conn, "/x", "o-1")
    with pytest.raises(InputError, match="SQLAlchemy Connection or Session or a psycopg connection"):
        _submit(object(), "/x", "o-2")
    if hub.name == "redis-pg":
        raw = psycopg_connection(hub.database_url)
        raw.autocommit = True
        with pytest.raises(InputError, match="autocommit"):
            _submit(raw, "/x", "o-3")
        raw.close()
    assert _message("o-1") == _message("o-2") == _message("o-3") == []


def _run_caller(hub: backends.Backend, seed: int, prefix: str, external) -> subprocess.CompletedProcess:
    env = {**os.environ, **hub.env, "OPENHUB_TEST_EXTERNAL_URL": external.url}
    return subprocess.run(
        [backends.python(), "-m", "tests.support.caller", str(seed), prefix],
        env=env,
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_commit_then_sigkill_before_the_publish_ends_ok_within_a_poll_interval(hub, engine, prefix, external) -> None:
    # Seed 1's last case is the one it dies in; find a seed whose death comes after a commit, before the
    # publish: what the caller script draws for it (tests/support/caller.py) is replayed here.
    seed = next(s for s in range(1000) if _draws(s, hub)[-1][1:] == (True, "before_publish"))
    done = _run_caller(hub, seed, prefix, external)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    order = f"{prefix}-{seed}-{len(_draws(seed, hub)) - 1}"
    assert order in _orders(prefix)
    final = wait_final(wait_for(lambda: _message(order), 30, f"the message of {order}")[0].id)
    assert final.state == "OK", (final.state, final.failed_error)
    with transaction() as conn:  # taken by the poller's due scan, not after the lease grace (4 s)
        claimed = (
            conn.execute(
                select(transitions.c.at).where(transitions.c.message_id == final.id, transitions.c.event == "claimed")
            )
            .scalars()
            .first()
        )
        received = conn.execute(select(M.received_at).where(M.id == final.id)).scalar_one()
        history = conn.execute(
            select(transitions.c.at, transitions.c.event)
            .where(transitions.c.message_id == final.id)
            .order_by(transitions.c.id)
        ).all()
    assert (claimed - received).total_seconds() < 3.5, [(str(a), e) for a, e in history]


def _draws(seed: int, hub: backends.Backend) -> list[tuple[str, bool, str | None]]:
    """What tests/support/caller.py draws for `seed`: each case's kind, commit and kill."""
    rnd = random.Random(seed)
    kinds = _kinds(hub)
    kill_at = rnd.randrange(0, 12)
    cases = []
    for n in range(kill_at + 1):
        kill = rnd.choice(["before_submit", "before_commit", "before_publish"]) if n == kill_at else None
        kind = rnd.choice(kinds)
        cases.append((kind, rnd.random() < 0.6, kill))
    return cases


def test_random_commits_rollbacks_and_kills_keep_message_iff_order(hub, engine, prefix, external) -> None:
    started, seeds = time.monotonic(), 0
    while time.monotonic() - started < 10:  # each backend: as many killed callers as fit in 10 s
        done = _run_caller(hub, random.randrange(10**9), prefix, external)
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        seeds += 1
    orders = _orders(prefix)
    with transaction() as conn:
        found = conn.execute(
            select(M.id, M.correlation_id).where(M.correlation_id.like(f"{prefix}-%"), M.source_system == "CALLER")
        ).all()
    assert {c for _, c in found} == orders, "a message exists if and only if its order does"
    for message_id, order in found:
        assert wait_final(message_id, 120).state == "OK"
        assert external.count(f"{prefix}/{order}/a") == 1
    assert seeds >= 2 and orders
