"""The promise model's regression examples: each break ever fixed, as the shortest run of the model's own
rules that reaches it (tests/support/promise_model.py), with every invariant checked after each rule.

The random search of test_promise_model.py reaches some of these classes only after thousands of rules,
beyond the CI budget (bench/RESULTS.md, "Mutations"); these runs reach each in a few. `bench/mutations.py`
reverts each fix (tests/support/mutations.py) and shows which test here catches it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import INVARIANT_MARKER

from tests.support.promise_model import PromiseMachine

INVARIANTS = [name for name in dir(PromiseMachine) if hasattr(getattr(PromiseMachine, name), INVARIANT_MARKER)]


def play(
    *rules: tuple[str, dict[str, Any]], store: dict[str, str] | None = None, tuned: dict[str, str] | None = None
) -> None:
    """Run the model's rules in this order on a fresh hub, checking every invariant after each; then let
    it settle (every message ends) and check them once more. `store`: the hub's on that PostgreSQL database;
    `tuned`: settings of the example's own, over the model's."""
    machine = type("Example", (PromiseMachine,), {"store": store or {}, "tuned": tuned or {}})()
    try:
        for name, args in [*rules, ("settle", {})]:
            getattr(machine, name)(**args)
            for invariant in INVARIANTS:
                getattr(machine, invariant)()
    finally:
        machine.teardown()


def interrupt(route: str, action: str, whom: str = "self", nested: bool = False) -> tuple[str, dict[str, Any]]:
    return "submit_and_interrupt", {"route": route, "action": action, "whom": whom, "nested": nested}


def arm(step: str, action: str, whom: str = "self", nested: bool = False) -> tuple[str, dict[str, Any]]:
    return "arm_in_flight", {"step": step, "action": action, "whom": whom, "nested": nested}


def submit(route: str) -> tuple[str, dict[str, Any]]:
    return "submit", {"route": route}


def act(action: str, pick: int) -> tuple[str, dict[str, Any]]:
    return "operator_acts", {"action": action, "pick": pick}


RUN: tuple[str, dict[str, Any]] = ("run", {})


def tick(minutes: int) -> tuple[str, dict[str, Any]]:
    return "tick", {"minutes": minutes}


# mutation (tests/support/mutations.py) -> the rules that reach its break
SCENARIOS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # issue 38: a sync route's result, when the run that made its last call loses its lease (cancelled and
    # restarted mid-call): the next run skips the call, and must find it
    "sync_result_lost_with_run": [
        ("call_sync_interrupted", {"action": "cancel_restart", "nested": False, "wait": 0.0})
    ],
    # issue 9's review
    "cancel_drops_running_run": [interrupt("p.flow", "cancel_restart", nested=True)],
    "done_step_called_again": [submit("p.flow"), arm("second", "fail"), RUN, tick(10)],
    # issue 26's second read
    "split_done_without_children": [interrupt("p.split_hooked", "cancel"), act("restart", 0)],
    "split_restart_reruns_cancelled_child": [
        interrupt("p.sequence", "cancel"),
        arm("*", "cancel_restart", "parent", nested=True),
        RUN,
    ],
    "total_restart_drops_other_success": [
        submit("p.entity"),
        arm("second", "fail"),
        RUN,
        submit("p.flow"),
        submit("p.entity"),
        arm("sync", "reject"),
        RUN,
        arm("sync", "reject"),
        act("total_restart", 2),
        tick(10),
    ],
    "undrain_starts_sequential_children": [interrupt("p.sequence", "drain_undrain", nested=True), RUN],
    "child_key_like_source_id": [submit("p.split_hooked"), RUN, ("submit_like_a_child", {"pick": 0}), RUN],
    "webhook_id_per_message_state": [interrupt("p.flow", "reject"), arm("*", "reject"), act("restart", 0)],
    # issue 33: answers bound to their wait
    "duplicate_answers_next_wait": [submit("p.two_waits"), RUN, act("respond", 0), act("respond_stale", 0)],
    "equal_answer_dropped": [submit("p.two_waits"), RUN, act("respond", 0), act("respond", 0)],
    "stale_answer_taken": [submit("p.two_waits"), RUN, tick(120), tick(1), act("respond_stale", 0)],
    # issue 33: a fault of the hub's own is no failure; a poison message ends
    "lost_run_counts_failure": [interrupt("p.flow", "crash"), tick(0), tick(1)],
    "max_lost_runs_ignored": [interrupt("p.flow", "poison")],
    # this stop's review of the fenced let-go: a worker dies in p.flow's first call, and the run the repair
    # drives next is fenced before its step runs; the record it puts back must still tell the next run that
    # the call was begun (redelivered)
    "fenced_entry_forgets_a_begun_call": [
        submit("p.flow"),
        arm("first", "crash"),
        RUN,
        ("heartbeat_falls_behind_before_a_step_runs", {}),
        tick(10),
        tick(10),
    ],
    # issue 37 (fan-out): a topic's family restarted by an operator once it ended OK; its receivers confirmed
    "fan_out_family_restarted": [submit("p.published"), RUN, act("restart", 0)],
    "fan_out_receivers_unconfirmed": [("submit_from_a_protocol_system", {"route": "p.published"}), RUN],
    # the fence in the model's search (this stop): a batch whose only member is fenced before its call has no
    # outcome to write, and its task raised IndexError
    "batch_with_every_member_stopped": [submit("p.batch"), ("heartbeat_falls_behind_before_a_step_runs", {}), RUN],
    # issue 33: chains lost with the broker
    "lost_chains_wait_lease_grace": [submit("p.flow"), submit("p.entity"), ("lose_broker", {})],
    # issue 33 #3: a batch member cancelled while an earlier member's call runs (prefork: one after another)
    "batch_member_called_after_cancel": [
        submit("p.batch"),
        submit("p.batch"),
        submit("p.batch"),
        arm("first", "cancel", "newest"),
        RUN,
    ],
    # issue 33: a worker's runs lost together, more of them than the repair reads a transaction
    "repair_first_page_only": [
        interrupt("p.flow", "crash"),
        interrupt("p.flow", "crash"),
        interrupt("p.flow", "crash"),
        ("tick_repairs_every_lost_run", {"page": 2}),
    ],
    # issue 33 #7: a confirmer that blocks three times its sending lease while ticks go on (real time: `TUNED`)
    "confirm_lease_not_renewed": [
        ("confirmer_outlasts_its_lease", {"leases": 3}),
        submit("p.flow"),
        RUN,
    ],
    # issue 35: a worker dies mid-call while a second hub is open in this process (installed last)
    "crash_beat_in_the_process_s_store": [
        ("crash_beside_a_second_hub", {"route": "p.flow"}),
        ("tick_repairs_every_lost_run", {"page": 500}),
    ],
    # issue 33: a confirmation whose sender died mid-send, handed over to its task (test_hosts' "never confirmed")
    "handed_over_sending_row_left_alone": [
        ("confirmations_sent_by", {"tasks": True}),
        ("protocol_receiver_fails", {"times": 1}),
        ("submit_from_a_protocol_system", {"route": "p.flow"}),
        RUN,
        ("confirmation_sender_dies", {"pick": 0}),
    ],
}


# settings of an example's own: a sending lease of 2 s (max(confirm interval, step timeout, 2 x confirm timeout))
TUNED = {
    "confirm_lease_not_renewed": {
        "OPENHUB_CONFIRM_TIMEOUT": "1",
        "OPENHUB_STEP_TIMEOUT": "2",
        "OPENHUB_CONFIRM_INTERVAL": "2",
    }
}

# PostgreSQL's own paths (a batch's claims and outcomes written by one set statement, openhub.engine.batch_claims and
# batch_writes; chain mode's single statement, openhub.engine.entry.enter_alone)
ON_POSTGRES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # issue 42: a member cancelled while its own call runs; only the group write's compare-and-set stops its
    # next step (the first member reads nothing before its next call)
    "batch_set_write_without_cas": [
        submit("p.batch"),
        submit("p.batch"),
        submit("p.batch"),
        arm("first", "cancel", "self"),
        RUN,
    ],
    "batch_member_called_after_cancel": SCENARIOS["batch_member_called_after_cancel"],
    # issue 42: the batch's first member cancelled after its chain was published, before the batch task ran:
    # only the claim statement's compare-and-set keeps the cancel (the first member reads nothing before its
    # call; a later one's read finds the cancel), while the other members are claimed with it and go on
    "batch_set_claim_without_cas": [submit("p.batch"), submit("p.batch"), submit("p.batch"), act("cancel", 0)],
    # issue 33 #4 and issue 26 #3: this host's clock 150 s ahead of the database's; the hub's stored times
    # (a message's, its history's, this process's heartbeat) are the database's
    "store_now_process_clock": [
        ("skew_this_hosts_clock", {"seconds": 150}),
        submit("p.flow"),
        arm("first", "fail"),
        RUN,
        ("stored_times_on_the_databases_clock", {}),
    ],
    # issue 42's review: chain mode's single statement took p.flow's second step's lease while another delivery
    # had inserted the step's call record; an operator's cancel comes before the entry's own transaction
    "single_statement_entry_without_cas": [
        ("cancel_as_a_step_is_entered_beside_another_delivery", {"route": "p.flow", "step": "second"})
    ],
    # issue 42's review: this process's heartbeat gap ends while the single statement's answer travels; the run
    # the other workers repaired meanwhile calls the step, the one entered by the statement must not
    # (the route's first step: the claim statement; the second: the lease statement)
    "single_statement_fence_start_after_commit": [
        ("heartbeat_gap_ends_as_a_lease_is_answered", {"route": "p.flow", "step": "first"}),
        ("heartbeat_gap_ends_as_a_lease_is_answered", {"route": "p.flow", "step": "second"}),
    ],
}
ON_POSTGRES["heartbeat_on_host_clock"] = ON_POSTGRES["store_now_process_clock"]
ON_POSTGRES["fenced_entry_forgets_a_begun_call"] = SCENARIOS["fenced_entry_forgets_a_begun_call"]
ON_POSTGRES["batch_with_every_member_stopped"] = SCENARIOS["batch_with_every_member_stopped"]


@pytest.mark.parametrize("mutation", sorted(SCENARIOS))
def test_the_promise_holds_where_it_once_broke(mutation: str) -> None:
    play(*SCENARIOS[mutation], tuned=TUNED.get(mutation))


@pytest.mark.parametrize("mutation", sorted(ON_POSTGRES))
def test_the_promise_holds_where_it_once_broke_on_postgres(mutation: str, local_store: str) -> None:
    play(*ON_POSTGRES[mutation], store={"OPENHUB_DATABASE_URL": local_store}, tuned=TUNED.get(mutation))
