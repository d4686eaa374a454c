"""Independent children (issue 37, part 5): `Split(..., bound=False)` with real workers on both backends: the
parent goes on at once, is neither held nor failed by its children, and they still name it."""

from __future__ import annotations

import uuid

import pytest

import openhub
from tests.support.waiting import wait_final, wait_for, wait_state

pytestmark = pytest.mark.usefixtures("hub")


def test_a_failing_child_leaves_its_parent_ok_and_a_waiting_one_does_not_hold_it(prefix, external) -> None:
    parent = openhub.submit(
        "dlv.unbound",
        {"prefix": prefix, "children": ["fail", "wait", "ok"]},
        source_system="CRM",
        correlation_id=uuid.uuid4().hex,
    )
    done = wait_final(parent.id)
    assert done.state == "OK", (done.state, done.failed_error)
    children = wait_for(
        lambda: (lambda c: c if len(c) == 3 else None)(
            sorted(openhub.list_messages(parent_id=parent.id), key=lambda v: v.id)
        ),
        what="the three children",
    )
    assert all(c.parent_id == parent.id for c in children)  # traceable to their parent
    failed, waiting, ok = children
    assert wait_final(failed.id).state == "FAILED" and wait_final(ok.id).state == "OK"
    waiting = wait_state(waiting.id, "POSTPONED")  # a minute away: its parent did not wait for it
    assert [external.count(f"{prefix}/{s}") for s in ("before", "after")] == [1, 1]
    assert openhub.get_message(parent.id).state == "OK"  # its children's ends did not touch it
    openhub.cancel(waiting.id)
