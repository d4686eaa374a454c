"""Review 42: a lease written by chain mode's single statement is fenced as one written in a transaction.

`workers.fenced(since)` fences a run whose lease was taken at `since` where this process's heartbeat gap
ended at or after `since`: others may have judged the process dead meanwhile and repaired the run. In a
transaction the run's `since` (`Entered.started`) is read before its COMMIT, so a gap that ends after the
lease became visible always fences it. The single statement commits on the server before its answer is
read; `since` must still be read before it is sent."""

from __future__ import annotations

import os
import time

import pytest
from sqlalchemy import event, select

from openhub.store import db, workers
from openhub.store.schema import transitions
from openhub.testing import LocalHub

ROUTES = "tests.support.hop_routes"


@pytest.mark.parametrize("step", ["one", "two"])
def test_a_heartbeat_gap_ending_once_the_lease_committed_fences_the_run(
    local_store: str, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalHub(ROUTES, OPENHUB_DATABASE_URL=local_store) as hub:
        message = hub.submit("hops.flow", {}, correlation_id=f"fence-{step}")
        monkeypatch.setattr(workers, "_beating", os.getpid())
        monkeypatch.setattr(workers, "_renewed", time.monotonic())  # fresh; no settings: no age fence
        lease_of = {"one": "WITH v AS", "two": "WITH lease AS"}[step]
        seen: list[str] = []
        pending = [False]

        def answered(conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
            # The heartbeat comes back from a gap right after the statement that made the step's lease
            # durable: the autocommit statement itself once answered, or the COMMIT of the transaction
            # whose statement took it (the path before the single statement: that of SQLite too).
            text = statement.lstrip()
            if seen:
                return
            if conn.connection.dbapi_connection.autocommit:
                if text.startswith(lease_of):
                    seen.append(text)
                    workers._gap_ended = time.monotonic()
            elif text.startswith(("WITH lease AS", "UPDATE messages SET step_run")):
                pending[0] = True

        def commit(conn):  # type: ignore[no-untyped-def]
            if pending[0] and not seen:
                seen.append("COMMIT")
                workers._gap_ended = time.monotonic()

        engine = db.get_engine(local_store)
        event.listen(engine, "after_cursor_execute", answered)
        event.listen(engine, "commit", commit)
        try:
            hub.run()
        finally:
            event.remove(engine, "after_cursor_execute", answered)
            event.remove(engine, "commit", commit)
            monkeypatch.setattr(workers, "_gap_ended", float("-inf"))
        with db.reading(local_store) as conn:
            history = conn.execute(
                select(transitions.c.event, transitions.c.step_key, transitions.c.detail)
                .where(transitions.c.message_id == message.id)
                .order_by(transitions.c.id)
            ).all()
        assert seen, "the lease statement was not seen"
        ran = [key for event_, key, _ in history if event_ == "step_ok"]
        # The run whose lease was taken before the gap ended must not call: it is let go as fenced.
        assert step not in ran, history
