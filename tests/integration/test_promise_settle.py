"""The promise model's settle (tests/support/promise_model.py) on steps hypothesis found, replayed as they were."""

from __future__ import annotations

from tests.support.promise_model import PromiseMachine


def test_settle_under_a_live_max_fails_of_600() -> None:
    """Found on the apihub branch (2026-11-27; the same steps fail main): an admin's live OPENHUB_MAX_FAILS of
    600, and two p.two_waits messages whose answers never come, in opposite phases of their response timeout
    (one waits while the other is PARTLY_FAILED until its retry). Each tick of the quiet hours leaves one of them
    PARTLY_FAILED, not final after 32 hours by design: the settle forgets the admin's retry settings first."""
    state = PromiseMachine()
    try:
        state.confirmations_sent_by(tasks=False)
        state.admin_changes_a_retry_setting(name="OPENHUB_MAX_FAILS", value="600")
        state.submit(route="p.two_waits")
        state.run()
        state.tick(minutes=120)  # the first one's wait timed out: PARTLY_FAILED until its retry
        state.submit(route="p.two_waits")
        state.run()  # the second one waits
        state.settle()
    finally:
        state.teardown()
