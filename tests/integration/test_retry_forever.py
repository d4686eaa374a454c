"""Retry for ever (issue 37, part 4): `RetryPolicy(max_fails=None)` with its back-off capped, with real workers on
both backends; and a source system's own confirmation retry policy."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

import openhub
from openhub.store.schema import transitions
from tests.support.process_store import transaction
from tests.support.waiting import wait_final

pytestmark = pytest.mark.usefixtures("hub")


def test_a_step_failing_fifty_times_then_succeeding_ends_ok(prefix, external) -> None:
    external.fail(f"{prefix}/forever", times=50)
    m = openhub.submit("dlv.forever", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex)
    done = wait_final(m.id, timeout=180)
    assert done.state == "OK" and done.failed_count == 50, (done.state, done.failed_count, done.failed_error)
    assert external.count(f"{prefix}/forever", 503) == 50 and external.count(f"{prefix}/forever", 200) == 1
    with transaction() as conn:
        events = conn.execute(select(transitions.c.event).where(transitions.c.message_id == m.id)).scalars().all()
    assert events.count("transient") == 50
