"""Assertions the once-only tests share."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select

from openhub.store.schema import transitions
from tests.support.process_store import transaction


def step_ok_counts(message_ids: list[int]) -> Counter:
    """How often each (message, step) was recorded OK in the history."""
    t = transitions.c
    with transaction() as conn:
        rows = conn.execute(select(t.message_id, t.step_key).where(t.event == "step_ok", t.message_id.in_(message_ids)))
        return Counter((m, s) for m, s in rows)


def assert_each_step_ok_once(message_ids: list[int], steps: list[str]) -> None:
    """Every listed step of every message was recorded OK exactly once."""
    counts = step_ok_counts(message_ids)
    wrong = {(m, s): counts.get((m, s), 0) for m in message_ids for s in steps if counts.get((m, s), 0) != 1}
    assert not wrong, f"steps not recorded OK exactly once: {wrong}"
