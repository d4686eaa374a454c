"""Property-based run over /openapi.json (schemathesis): no 5xx, and nothing accepted is lost.

Every documented operation gets generated requests (bounded: a few dozen examples each, well
under two minutes for both backends). Submissions are steered to a real route half of the time
so that acceptances are exercised, and every 200/202 answer to a submission is checked against
the store: the message exists with the correlation id and source system it was accepted with.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import schemathesis
from hypothesis import HealthCheck, given, settings

import openhub
from openhub.api.app import create_app
from tests.integration.api.conftest import ADMIN, CREDENTIALS, CRM

SUBMIT = "/api/v1/messages/{service}/{operation}"
BATCH = "/api/v1/messages:batch"


def _steer(case) -> None:  # noqa: ANN001
    """Point some generated submissions at a route that exists, so acceptance paths are fuzzed too."""
    if case.operation.path == SUBMIT and len(str(case.path_parameters.get("service", ""))) % 2 == 0:
        case.path_parameters = {"service": "test", "operation": "flow"}
    if case.operation.path == BATCH and isinstance(case.body, dict) and isinstance(case.body.get("messages"), list):
        for item in case.body["messages"]:
            if isinstance(item, dict) and len(str(item.get("correlation_id", ""))) % 2 == 0:
                item.pop("service", None)
                item.pop("operation", None)
                item["route"] = "test.flow"


def _check_not_lost(case, response) -> None:  # noqa: ANN001
    if response.status_code not in (200, 202):
        return
    if case.operation.path == SUBMIT:
        body = response.json()
        stored = openhub.get_message(body["id"])
        assert stored.source_system == "CRM"
        assert stored.correlation_id == body["correlation_id"] == case.headers["X-Correlation-Id"]
    elif case.operation.path == BATCH:
        answered = response.json()["messages"]
        assert len(answered) == len(case.body["messages"])
        for item, accepted in zip(case.body["messages"], answered):
            stored = openhub.get_message(accepted["id"])
            assert stored.source_system == "CRM" and stored.correlation_id == item["correlation_id"]


def test_no_server_error_and_nothing_accepted_is_lost(api_env):  # noqa: ANN001
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(credentials=CREDENTIALS))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13
    seen: dict[str, Counter[int]] = defaultdict(Counter)
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)
        def fuzz(case) -> None:  # noqa: ANN001
            _steer(case)
            auth = CRM if case.operation.path in (SUBMIT, BATCH) else ADMIN
            response = case.call(headers=auth)
            seen[case.operation.path][response.status_code] += 1
            assert response.status_code < 500, (case.operation.path, response.status_code, response.text[:500])
            _check_not_lost(case, response)

        fuzz()
    # the run reached the interesting answers, not only 4xx
    assert seen[SUBMIT][202] and seen[BATCH][202], dict(seen)
    assert seen["/api/v1/messages"][200] and seen["/api/v1/messages/{message_id}"][404], dict(seen)
