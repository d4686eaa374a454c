"""Fatal errors fail a message at once; every failure carries a searchable error code (issue 13)."""

from __future__ import annotations

from typing import Iterator

import pytest

import openhub
from openhub.testing import ExternalSystem, LocalHub
from tests.support import promise_routes as routes


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with routes.local_hub(OPENHUB_MAX_FAILS="3") as local:
        yield local


@pytest.fixture
def external() -> Iterator[ExternalSystem]:
    system = ExternalSystem().start()
    yield system
    system.stop()


@pytest.mark.parametrize(
    "status, state, code, calls",
    [
        (422, "FAILED", "HTTP_422", 1),  # the request itself is wrong: retrying cannot help
        (404, "FAILED", "HTTP_404", 1),
        (429, "PARTLY_FAILED", "HTTP_429", 1),  # asks to try again
        (503, "PARTLY_FAILED", "HTTP_503", 1),
    ],
)
def test_http_4xx_fails_at_once_and_5xx_is_retried(hub, external, status, state, code, calls) -> None:
    external.fail("/billing", times=1, status=status)
    view = hub.submit("p.reserve", {"raise": "http", "url": f"{external.url}/billing"})
    hub.run()
    done = hub.get(view.id)
    assert (done.state, done.error_code) == (state, code)
    assert external.count("/billing") == calls


def test_a_declared_fatal_exception_fails_at_once_and_is_confirmed_with_its_code(hub) -> None:
    view = hub.submit("p.reserve", {"raise": "out_of_stock"})
    hub.run()
    done = hub.get(view.id)
    assert (done.state, done.failed_count, done.error_code) == ("FAILED", 1, "OutOfStock")
    assert routes.CONFIRMED == [(view.id, "FAILED")]


def test_a_bug_is_retried_and_searchable_by_its_code(hub) -> None:
    view = hub.submit("p.reserve", {"raise": "bug"})
    hub.run()
    assert (hub.get(view.id).state, hub.get(view.id).error_code) == ("PARTLY_FAILED", "KeyError")
    assert [v.id for v in openhub.list_messages(error_code="KeyError")] == [view.id]
    assert openhub.list_messages(error_code="HTTP_422") == []


def test_a_restart_clears_the_error_code(hub) -> None:
    view = hub.submit("p.reserve", {"raise": "out_of_stock"})
    hub.run()
    assert openhub.restart(view.id).error_code is None


def test_fatal_takes_exception_classes_only() -> None:
    from openhub import ConfigurationError, Route, step

    with pytest.raises(ConfigurationError, match="fatal= takes exception classes"):
        step(key="a", fatal="ValueError")(lambda ctx: None)
    with pytest.raises(ConfigurationError, match="fatal= takes exception classes"):
        Route("a.b", steps=[step(key="a")(lambda ctx: None)], fatal=[42])
