"""The refused-credentials table of the ingress (openhub.api.auth.FailureLimit): per subject, within a
window, bounded without ever forgetting everyone at once (issue 34 H1)."""

from __future__ import annotations

from openhub.api.auth import FailureLimit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_subject_is_limited_after_its_failures_within_the_window_and_free_after_it() -> None:
    clock = Clock()
    limit = FailureLimit(3, 60, clock=clock)
    for _ in range(2):
        limit.failed("address 10.0.0.1", "secret aa")
        assert limit.retry_after("address 10.0.0.1") is None
    clock.now += 10
    limit.failed("address 10.0.0.1", "secret bb")
    assert limit.retry_after("address 10.0.0.1") == 50  # until the first of the three leaves the window
    assert limit.retry_after("address 10.0.0.2", "secret bb") is None  # neither was refused 3 times
    assert limit.retry_after("address 10.0.0.2", "secret aa") is None
    limit.failed("address 10.0.0.2", "secret aa")
    assert limit.retry_after("address 10.0.0.2", "secret aa") == 50  # the secret's third refusal
    clock.now += 50
    assert limit.retry_after("address 10.0.0.1") is None
    clock.now += 60
    assert limit.retry_after("address 10.0.0.1", "secret aa") is None
    assert len(limit) == 2  # the two subjects met, whose last failure left the window, are dropped


def test_a_flood_of_subjects_forgets_the_least_recently_failing_never_everyone() -> None:
    clock = Clock()
    limit = FailureLimit(2, 60, capacity=100, clock=clock)
    for _ in range(2):
        limit.failed("address victim-guesser")
    for n in range(98):
        limit.failed(f"address flood-{n}")
    limit.failed("address victim-guesser")  # the guesser keeps failing: it stays recent
    for n in range(98, 500):
        clock.now += 0.01
        limit.failed(f"address flood-{n}")
        if n % 50 == 0:
            limit.failed("address victim-guesser")
    assert len(limit) == 100  # bounded
    assert limit.retry_after("address victim-guesser") is not None  # and its count was never reset
    assert limit.retry_after("address flood-499") is None and limit.retry_after("address flood-0") is None
