"""A process's PostgreSQL connections are kept for the next transaction, however many steps share them."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event

from openhub.store.db import PG_MAX_OVERFLOW, PG_POOL_SIZE, dispose_engines, get_engine, transaction
from tests.support.backends import postgres_database


def test_busy_transactions_reuse_the_processs_connections_instead_of_opening_new_ones() -> None:
    # On the gevent or threads pool all of a process's store connections are busy at once. A
    # connection the pool opened beyond the ones it keeps was closed after its transaction, so
    # every other transaction connected to PostgreSQL anew.
    busy = PG_POOL_SIZE + PG_MAX_OVERFLOW
    with postgres_database() as url:
        opened: list[int] = []
        event.listen(get_engine(url), "connect", lambda *_: opened.append(1))
        barrier = threading.Barrier(busy)
        errors: list[BaseException] = []

        def step() -> None:
            try:
                for _ in range(5):
                    barrier.wait(timeout=30)  # every connection in use together, five times over
                    with transaction(url) as conn:
                        conn.exec_driver_sql("SELECT pg_sleep(0.05)")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=step) for _ in range(busy)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        dispose_engines()
        assert errors == []
        assert len(opened) == busy, f"{len(opened)} connections opened for {busy} at a time"


def test_a_transaction_that_finds_no_free_connection_in_time_finds_the_store_unavailable(monkeypatch) -> None:
    # On the threads pool more steps than connections wait for one; past the pool's timeout SQLAlchemy
    # raised its own TimeoutError, which the engine did not read as "try again": the step was recorded
    # as failed instead of waiting for the store.
    from openhub.core.errors import StoreUnavailable
    from openhub.store import db

    monkeypatch.setattr(db, "PG_POOL_SIZE", 1)
    monkeypatch.setattr(db, "PG_POOL_TIMEOUT", 0.2)
    with postgres_database() as url:
        dispose_engines()
        held = get_engine(url).connect()  # the pool's one connection, busy
        try:
            with pytest.raises(StoreUnavailable, match="no free connection"), transaction(url):
                pass
        finally:
            held.close()
        with transaction(url) as conn:  # free again
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
        dispose_engines()
