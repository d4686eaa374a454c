"""A caller's service that writes its order and submits its message in one transaction, and dies at random.

Run as `python -m tests.support.caller SEED PREFIX` with a backend's OPENHUB_* environment: it writes
orders `PREFIX-SEED-n` into the table `caller_orders` of the hub's database, each with the message of
`test.flow` (correlation id: the order's id) submitted on the same connection (a SQLAlchemy Connection,
a Session, or on PostgreSQL a plain psycopg connection), commits or rolls back at random, and at a random
case kills itself (SIGKILL) before the submit, before the commit, or after the commit before the chain is
published. The invariant the test checks: a message exists if and only if its order does.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

import openhub
from openhub.service import messages as producer

ORDERS = sa.table("caller_orders", sa.column("id"))
CREATE = "CREATE TABLE IF NOT EXISTS caller_orders (id VARCHAR(200) PRIMARY KEY)"


@contextmanager
def orders_engine(url: str) -> Iterator[sa.Engine]:
    """The caller's own engine on the hub's database at `url`, with its table of orders."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(CREATE)
    try:
        yield engine
    finally:
        engine.dispose()


def die() -> None:
    """SIGKILL: no cleanup, no rollback, no atexit; the kernel closes the sockets."""
    os.kill(os.getpid(), signal.SIGKILL)


def psycopg_connection(url: str) -> Any:
    import psycopg

    return psycopg.connect(sa.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))


def one_case(engine: sa.Engine, url: str, kind: str, order: str, payload: dict, commit: bool, kill: str | None) -> None:
    """One order and its message in one transaction of `kind`, committed or rolled back (or killed)."""

    def submit(connection: Any) -> None:
        if kill == "before_submit":
            die()
        openhub.submit("test.flow", payload, source_system="CALLER", correlation_id=order, connection=connection)
        if kill == "before_commit":
            die()

    if kill == "before_publish":  # the chain's publish, after the commit, is where it dies
        producer.publish_new = lambda hub, fresh: die()  # type: ignore[assignment]
    if kind == "psycopg":
        raw = psycopg_connection(url)
        with raw.cursor() as cur:
            cur.execute("INSERT INTO caller_orders (id) VALUES (%s)", (order,))
        submit(raw)
        raw.commit() if commit else raw.rollback()
        if kill == "before_publish":  # no hook tells a psycopg commit: nothing would publish; die as told
            die()
        raw.close()
    elif kind == "session":
        with Session(engine) as session:
            session.execute(sa.insert(ORDERS).values(id=order))
            submit(session)
            session.commit() if commit else session.rollback()
    else:
        with engine.connect() as conn:
            conn.execute(sa.insert(ORDERS).values(id=order))
            submit(conn)
            conn.commit() if commit else conn.rollback()
    if kill == "before_publish" and commit and kind == "connection":
        import threading

        threading.Event().wait(30)  # its publish runs in a thread, which kills the process there
    if kill is not None:  # a rolled-back case has nothing to publish; a loaded box may leave it to the poller
        die()


def main(seed: int, prefix: str) -> None:
    rnd = random.Random(seed)
    url = os.environ["OPENHUB_DATABASE_URL"]
    engine = sa.create_engine(url)
    kinds = ["connection", "session"] + (["psycopg"] if url.startswith("postgresql") else [])
    kill_at = rnd.randrange(0, 12)
    for n in range(kill_at + 1):
        order = f"{prefix}-{seed}-{n}"
        kill = rnd.choice(["before_submit", "before_commit", "before_publish"]) if n == kill_at else None
        one_case(engine, url, rnd.choice(kinds), order, {"prefix": f"{prefix}/{order}"}, rnd.random() < 0.6, kill)
        print(order, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
