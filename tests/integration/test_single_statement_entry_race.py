"""Review 42: `entry.enter_alone` where its single statement took the lease but another statement had
inserted the step's call record (`inserted` False): the rest of the entry runs in a transaction of its own,
after the lease committed. A cancel committed in between must not be overwritten by that entry's writes
(here: the step found done, which ends the message) - as `enter`, whose lease and writes are one transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from openhub.engine import leases
from openhub.service.actions import cancel
from openhub.store import db
from openhub.store.schema import ext_calls, messages, transitions
from openhub.testing import LocalHub

ROUTES = "tests.support.hop_routes"


def test_a_cancel_between_the_lease_statement_and_the_entrys_transaction_stays(
    local_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    take_new = leases.take_new
    with LocalHub(ROUTES, OPENHUB_DATABASE_URL=local_store) as hub:
        message = hub.submit("hops.flow", {}, correlation_id="entry-race")

        def raced(conn, run, columns, now):  # type: ignore[no-untyped-def]
            row, inserted = take_new(conn, run, columns, now)
            if run.item.key == "three" and row is not None:
                # As where another delivery of the step's task inserted its record and made its call (the
                # record OK), and an operator cancelled the message before this entry's transaction.
                with db.transaction(local_store) as other:
                    other.execute(
                        update(ext_calls)
                        .where(ext_calls.c.message_id == run.message_id, ext_calls.c.step_key == "three")
                        .values(state="OK", ok_message_id=run.message_id, ok_msg_timestamp=row.msg_timestamp)
                    )
                cancel(run.message_id, hub=hub.hub)
                return row, False
            return row, inserted

        monkeypatch.setattr(leases, "take_new", raced)
        hub.run()
        assert hub.get(message.id).state == "CANCEL"
        with db.reading(local_store) as conn:  # the cancel kept the run as in flight; it made no call and let go
            assert conn.execute(select(messages.c.step_run).where(messages.c.id == message.id)).scalar() is None
        with db.reading(local_store) as conn:
            events = conn.execute(
                select(transitions.c.event).where(transitions.c.message_id == message.id).order_by(transitions.c.id)
            ).scalars()
            assert list(events)[-1] == "cancelled"
