"""The promise under interleavings, searched by hypothesis (tests/support/promise_model.py).

A fixed seed and budget in CI; `bench/model_soak.py` runs the same machine for 100,000 rules and more.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.support.promise_model import PromiseMachine

TestPromiseUnderInterleavings = PromiseMachine.TestCase
TestPromiseUnderInterleavings.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# The whole search alone takes about a minute; on a busy machine (make test-burn) several.
TestPromiseUnderInterleavings.pytestmark = [pytest.mark.timeout(900)]
