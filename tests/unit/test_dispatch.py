"""Step options map onto Celery task options (queue, priority, soft and hard time limits)."""

from __future__ import annotations

from datetime import timedelta

from openhub import Route, step
from openhub.config import get_settings
from openhub.dispatch import HARD_LIMIT_MARGIN, step_options


@step(timeout=timedelta(seconds=30), queue="mno")
def activate(ctx):  # noqa: ANN001, ANN201
    pass


@step
def plain(ctx):  # noqa: ANN001, ANN201
    pass


def test_step_timeout_queue_and_route_priority() -> None:
    route = Route("customer.set", steps=[activate, plain], priority=7, queue="crm")
    assert step_options(activate, route) == {"soft_time_limit": 30.0, "time_limit": 30.0 + HARD_LIMIT_MARGIN,
                                             "queue": "mno", "priority": 7}
    # A step without its own queue or timeout takes the route's queue and the default timeout.
    options = step_options(plain, route)
    assert options["queue"] == "crm"
    assert options["soft_time_limit"] == get_settings().step_timeout.total_seconds()


def test_no_queue_means_the_default_queue() -> None:
    assert "queue" not in step_options(plain, Route("customer.set", steps=[plain]))
