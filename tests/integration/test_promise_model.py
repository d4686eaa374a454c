"""The promise under interleavings, searched by hypothesis (tests/support/promise_model.py).

A fixed seed and budget in CI; `bench/model_soak.py` runs the same machine for 100,000 rules and more.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support.promise_model import PromiseMachine


def _search(examples: int) -> settings:
    """The CI search: a fixed seed (derandomized) and budget, 30 steps an example."""
    return settings(
        max_examples=examples,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


TestPromiseUnderInterleavings = PromiseMachine.TestCase
TestPromiseUnderInterleavings.settings = _search(100)
# The whole search alone takes about a minute; on a busy machine (make test-burn) several.
TestPromiseUnderInterleavings.pytestmark = [pytest.mark.timeout(900)]


class _OnPostgres(PromiseMachine):
    """The same machine on PostgreSQL, where a batch hands its members over in one set statement
    (openhub.engine.batch_writes) and the engine folds its writes into data-modifying CTEs."""

    store: dict[str, str] = {}  # the session's PostgreSQL database (conftest's `local_store`), set below


@pytest.fixture(scope="class")
def _model_database(local_store: str) -> Iterator[None]:
    _OnPostgres.store = {"OPENHUB_DATABASE_URL": local_store}
    yield


TestPromiseUnderInterleavingsOnPostgres = _OnPostgres.TestCase
TestPromiseUnderInterleavingsOnPostgres.settings = _search(30)
TestPromiseUnderInterleavingsOnPostgres.pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("_model_database"),
]
