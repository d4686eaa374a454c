"""Throttling: rule matching, 429 with Retry-After, counters shared through Redis."""

from __future__ import annotations

import uuid

import pytest

from openhub.api.throttle import MemoryCounters, Rule, Throttle, best_rule, parse_rules
from openhub.core.config import get_settings
from openhub.core.errors import ConfigurationError
from tests.integration.api.conftest import CRM, SHOP, make_client


def test_rules_parse_and_the_most_specific_wins():
    rules = parse_rules("CRM.setCustomer=100/60, CRM.*=500/60, *.setCustomer=300/60, *.*=1000/60")
    assert best_rule(rules, "CRM", "setCustomer") == Rule("CRM", "setCustomer", 100, 60)
    assert best_rule(rules, "CRM", "other") == Rule("CRM", "*", 500, 60)
    assert best_rule(rules, "SHOP", "setCustomer") == Rule("*", "setCustomer", 300, 60)
    assert best_rule(rules, "SHOP", "other") == Rule("*", "*", 1000, 60)
    assert best_rule(parse_rules("CRM.a=1/1"), "SHOP", "a") is None
    assert parse_rules("") == []
    for bad in ("CRM=1/60", "CRM.a=x/60", "CRM.a=1/0", "CRM.a=1", "CRM.a=1/60,CRM.a=2/60"):
        with pytest.raises(ConfigurationError):
            parse_rules(bad)


def test_fixed_window_in_memory():
    now = [1000.0]
    throttle = Throttle(parse_rules("A.b=2/10"), MemoryCounters(clock=lambda: now[0]))
    assert throttle.check("A", "b").allowed and throttle.check("A", "b").allowed
    refused = throttle.check("A", "b")
    assert not refused.allowed and refused.retry_after == 10
    assert throttle.check("A", "c").allowed  # another operation: no rule
    now[0] = 1010.0  # next window
    assert throttle.check("A", "b").allowed


def _throttle(rules: str, prefix: str) -> Throttle:
    return Throttle.from_settings(rules, get_settings().redis_url, prefix=prefix)


def submit(client, flow_payload, headers=CRM):
    return client.post(
        "/api/v1/messages/test/flow", json=flow_payload, headers={**headers, "X-Correlation-Id": uuid.uuid4().hex}
    )


def test_over_the_limit_is_429_with_retry_after(api_env, flow_payload):
    # A day-long window: the test cannot straddle two windows in practice.
    throttle = _throttle("CRM.flow=2/86400,*.*=100/86400", f"t-{uuid.uuid4().hex}:")
    with make_client(throttle=throttle) as client:
        assert [submit(client, flow_payload).status_code for _ in range(2)] == [202, 202]
        r = submit(client, flow_payload)
        assert r.status_code == 429
        assert 1 <= int(r.headers["Retry-After"]) <= 86400
        assert submit(client, flow_payload, SHOP).status_code == 202  # SHOP falls under *.*
        batch = {"messages": [{"route": "test.flow", "payload": flow_payload, "correlation_id": uuid.uuid4().hex}]}
        assert client.post("/api/v1/messages:batch", json=batch, headers=CRM).status_code == 429


def test_counters_are_shared_by_ingress_processes_through_redis(api_env, flow_payload):
    if get_settings().redis_url is None:
        pytest.skip("the embedded backend has no Redis: counters are per process")
    prefix = f"t-{uuid.uuid4().hex}:"
    with (
        make_client(throttle=_throttle("CRM.flow=3/86400", prefix)) as one,
        make_client(throttle=_throttle("CRM.flow=3/86400", prefix)) as two,
    ):
        assert submit(one, flow_payload).status_code == 202
        assert submit(two, flow_payload).status_code == 202
        assert submit(one, flow_payload).status_code == 202
        assert submit(two, flow_payload).status_code == 429


def test_redis_down_lets_requests_through(api_env, flow_payload):
    from tests.support.backends import free_port

    throttle = Throttle.from_settings("CRM.flow=0/60", f"redis://127.0.0.1:{free_port()}/0")
    with make_client(throttle=throttle) as client:
        assert submit(client, flow_payload).status_code == 202
