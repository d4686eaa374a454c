"""The promise across hosts (issue 22): three worker hosts as network namespaces, a fault schedule
over them, and the Jepsen-style checker over the external system's own log (tests/support/hosts.py,
tests/support/history.py). bench/hosts_soak.py runs the same for longer."""

from __future__ import annotations

import json

import pytest

from tests.support import hosts

pytestmark = pytest.mark.chaos

WHY_NOT = hosts.available()


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
@pytest.mark.timeout(540)  # setting up three hosts, 150 s of faults and up to 180 s of settling, on a busy box
def test_every_fault_kind_once_keeps_the_promise(tmp_path) -> None:
    # Each kind of fault but a Redis restart once, in this order, on hosts chosen by the seed; about three
    # minutes (a run that settles does so in seconds; one that does not reports what it waits for after 180 s).
    # Plain, fused, batch (groups of four in one task), split, funnel and guaranteed-order traffic, the third host's
    # worker on -P gevent (-c 50); the strict checker (tests/unit/test_history.py shows
    # what it flags). Redis restarted empty is tests/chaos/test_broker_restart.py's (ten times under load) and
    # bench/hosts_soak.py's: in this run it left messages unsettled past its bound in 1 of 6 runs, not yet
    # explained (beat's openhub.poll and a chain's publication failed while Redis was away).
    order = ["stall", "cut_pg", "skew", "cut_both", "kill", "cut_redis", "lossy_link", "slow_link"]
    report, facts = hosts.chaos_run(
        tmp_path, seed=22, seconds=150, order=order, kinds=order, settle=180, longest=12, calm=(2.0, 5.0)
    )
    found = json.dumps({"summary": report.summary(), "details": report.details(), "facts": facts}, indent=1)
    assert {f["kind"] for f in facts["faults"]} >= set(order), found
    # Every check strict: a repeat whose first call arrived within CUT_UNSEEN of its host's store cut is a call
    # in flight then (issue 33 break 6: a call is sent only within PROOF_AGE of a store round trip of its
    # process); one arriving later is a break.
    assert report.ok, found
    assert report.states == {"OK": report.messages}, report.states
