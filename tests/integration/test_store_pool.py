"""A process's PostgreSQL connections are kept for the next transaction, however many steps share them."""

from __future__ import annotations

import threading

from sqlalchemy import event

from openhub.db import PG_MAX_OVERFLOW, PG_POOL_SIZE, dispose_engines, get_engine, transaction
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
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=step) for _ in range(busy)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        dispose_engines()
        assert errors == []
        assert len(opened) == busy, f"{len(opened)} connections opened for {busy} at a time"
