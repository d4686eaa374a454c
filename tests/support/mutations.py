"""The promise's fixes, each with the smallest edit that reverts it (issue 33, "Prove it guards").

Each mutation names the break its fix closed, the file, the exact text of the fix as it stands in the
source (`fixed`, found exactly once: tests/unit/test_mutations.py) and the text that puts the break back
(`broken`). `bench/mutations.py` applies them one at a time to a copy of the tree and runs the CI
configuration of the model test against each: a mutation the model test passes is a break it would let
back in. `guard` names the hand-written test that caught the break when it was fixed, for the mutations
the model cannot reach (another broker, another store, real processes).

Snippets in openhub/store/workers.py, http.py, batch.py, confirm.py and notify.py may move while other work
on them merges: the unit test says which one no longer matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutation:
    name: str
    issue: str  # the issue and break (or review finding) its fix closed
    file: str  # relative to the repository's root
    fixed: str  # the fix's text, as it is in the source now (exactly once)
    broken: str  # the text that re-introduces the break
    # Whether the model tests can reach it at all: the search or a regression example of
    # tests/integration/test_promise_regressions.py (LocalHub in this process, on SQLite or PostgreSQL), or a
    # schedule of the model's part with real workers (tests/integration/test_promise_process_model.py). Where
    # they cannot, the entry says why (`unreachable`) and `guard` catches it.
    model: bool = True
    unreachable: str = ""
    guard: str = ""  # the hand-written test that caught the break when it was fixed

    def apply(self, root: Path) -> None:
        """Put the break back in the tree at `root`."""
        path = root / self.file
        text = path.read_text()
        if text.count(self.fixed) != 1:
            raise ValueError(f"{self.name}: the fix's text occurs {text.count(self.fixed)} times in {self.file}")
        path.write_text(text.replace(self.fixed, self.broken))


MUTATIONS: list[Mutation] = [
    # --- issue 9's review (fixed in 0c283c6) -----------------------------------------------------------------
    Mutation(
        "cancel_drops_running_run",
        "issue 9: a cancel lets go of a step still calling out, so a restart runs it beside the first call",
        "openhub/engine/lifecycle.py",
        (
            "    apply_event(\n"
            "        tx,\n"
            "        row,\n"
            "        Event.CANCELLED,\n"
            "        route,\n"
            "        attempt_id=str(uuid.uuid4()),\n"
            "        keep_run=row.worker is not None and row.step_run is not None,\n"
            "    )\n"
        ),
        "    apply_event(tx, row, Event.CANCELLED, route, attempt_id=str(uuid.uuid4()), keep_run=False)\n",
        guard="tests/integration/test_promise.py",
    ),
    Mutation(
        "done_step_called_again",
        "issue 9: a retry calls again a step whose call this message already made successfully",
        "openhub/engine/entry.py",
        "    if call is not None and call.ok_message_id == row.id:  # this message's call already succeeded\n",
        "    if False:  # reverted: a step's own success is not looked at\n",
        guard="tests/integration/test_promise.py",
    ),
    # --- issue 26's second read (fixed in ae78926, ba0c020, e97d1c5) -----------------------------------
    Mutation(
        "no_fence",
        "issue 26 #2: a process whose heartbeat fell behind (stalled, store away) still starts step calls",
        "openhub/store/workers.py",
        "    return time.monotonic() - _renewed > _fence_after() or _gap_ended >= since\n",
        "    return False  # reverted: no fence\n",
        guard="tests/integration/test_hub_faults.py::test_a_lease_the_fence_let_go_counts_nothing",
    ),
    Mutation(
        "heartbeat_on_host_clock",
        "issue 26 #3: heartbeats written on each host's clock, so a host 20 s ahead judges the others dead",
        "openhub/store/workers.py",
        "            now = conn.execute(select(database_now())).scalar_one() if is_postgres(conn) else utcnow()\n",
        "            now = utcnow()  # reverted: this host's clock\n",
        guard="tests/integration/test_one_clock.py::test_a_system_limit_holds_across_hosts",
    ),
    Mutation(
        "split_done_without_children",
        "issue 26 #8: a split recorded done with 0 children",
        "openhub/core/verdicts.py",
        "        return CallState.FAILED if self.event is Event.SPLIT or self.children else self.call_state\n",
        "        return self.call_state\n",
        guard="tests/integration/test_interleavings.py::test_a_split_cancelled_while_it_runs_writes_its_children_"
        "when_restarted",
    ),
    Mutation(
        "split_restart_reruns_cancelled_child",
        "issue 26 #1: restarting a split parent re-runs a cancelled child's call in flight",
        "openhub/engine/lifecycle.py",
        ("            finished_at=None,\n            attempt_id=str(uuid.uuid4()),\n"),
        ("            finished_at=None,\n            step_run=None,\n            attempt_id=str(uuid.uuid4()),\n"),
        guard="tests/integration/test_interleavings.py::test_restarting_a_cancelled_parent_waits_for_its_childs_"
        "call_in_flight",
    ),
    Mutation(
        "total_restart_drops_other_success",
        "issue 26 #4: a total restart deletes an entity record holding an older message's success",
        "openhub/engine/leases.py",
        (
            "    conn.execute(\n"
            "        delete(ext_calls).where(and_(X.message_id == row.id, or_(X.ok_message_id.is_(None), X.ok_message_id == row.id)))\n"
            "    )\n"
        ),
        "    conn.execute(delete(ext_calls).where(X.message_id == row.id))\n",
        guard="tests/integration/test_interleavings.py::test_a_total_restart_keeps_an_older_messages_success_on_the_"
        "entity_record",
    ),
    Mutation(
        "undrain_starts_sequential_children",
        "issue 26 #7: the end of a drain starts a sequential split's children waiting their turn",
        "openhub/service/pauses.py",
        "where(and_(M.state.in_(RESUMABLE), M.due_at.is_not(None)))\n",
        "where(M.state.in_(RESUMABLE))\n",
        guard="tests/integration/test_interleavings.py::test_ending_a_drain_does_not_start_children_waiting_their_turn",
    ),
    Mutation(
        "child_key_like_source_id",
        "issue 26 #5: a source system's id 'P#0.1' shares the idempotency key of P's first child",
        "openhub/core/verdicts.py",
        '        name = f"{name}#{row.id}"\n',
        "        pass\n",
        guard="tests/integration/test_interleavings.py::test_a_source_systems_id_like_a_childs_gets_its_own_"
        "idempotency_key",
    ),
    Mutation(
        "webhook_id_per_message_state",
        "issue 26 #6: a message FAILED twice (restarted between) is confirmed twice under one webhook id",
        "openhub/core/context.py",
        '            return f"openhub_{self.delivery_key}"\n',
        '            return f"openhub:{self.message.id}:{self.state}"\n',
        guard="tests/integration/test_interleavings.py::test_each_webhook_notification_has_its_own_idempotency_key",
    ),
    # --- issue 33: waits (518ee51) ------------------------------------------------------------------------
    Mutation(
        "duplicate_answers_next_wait",
        "issue 33 #1 (issue 26 #9): a late duplicate of answer 1 is taken as the answer of the next wait",
        "openhub/engine/waits.py",
        "    ask = conn.execute(select(waits).where(and_(W.token == token, W.message_id == row.id))).first()\n",
        (
            "    ask = conn.execute(select(waits).where(and_(W.token == token, W.message_id == row.id))).first()\n"
            "    if row.state == State.WAITING_FOR_RES:  # reverted: the open wait takes any answer\n"
            "        _answer(conn, _latest_ask(conn, row.id).id, text, by, now)\n"
            "        update_message(conn, row.id, response=text)\n"
            "        return Received.TAKEN, about\n"
        ),
        guard="tests/integration/test_waits.py",
    ),
    Mutation(
        "equal_answer_dropped",
        "issue 33 #2: a genuine answer equal to the previous one is dropped as a duplicate (matched by content)",
        "openhub/engine/waits.py",
        "    if ask is not None and ask.answer is not None:\n",
        "    if (ask is not None and ask.answer is not None) or (row.response is not None and row.response == text):\n",
        guard="tests/integration/test_waits.py",
    ),
    Mutation(
        "stale_answer_taken",
        "issue 33 #1: an answer for a wait that ended (asked again) is taken by the open wait",
        "openhub/engine/waits.py",
        (
            "    if (\n"
            "        ask is not None\n"
            "        and row.state == State.WAITING_FOR_RES\n"
            "        and ask.asked_at is not None\n"
            "        and ask.id == _latest_ask(conn, row.id).id\n"
            "    ):\n"
        ),
        "    if ask is not None and row.state == State.WAITING_FOR_RES and ask.asked_at is not None and ask.id is not None:\n",
        guard="tests/integration/test_waits.py",
    ),
    # --- issue 33: the hub's own faults (61c363e) --------------------------------------------------------
    Mutation(
        "lost_run_counts_failure",
        "issue 33 #10: a run lost with its worker counts as one of the message's failures",
        "openhub/core/states.py",
        "        if event is Event.LEASE_EXPIRED and lost_runs > max_lost_runs:\n",
        (
            "        if event is Event.LEASE_EXPIRED:\n"
            "            result = _failure(failed_count, max_fails)  # reverted: a lost run is a failure\n"
            "            if result.state is State.FAILED:\n"
            "                return Transition(result.state, result.failed_count, _FINISHED)\n"
            "            return Transition(result.state, result.failed_count, result.actions | {Action.RELEASE_FUNNEL})\n"
            "        if event is Event.LEASE_EXPIRED and lost_runs > max_lost_runs:\n"
        ),
        guard="tests/integration/test_hub_faults.py",
    ),
    Mutation(
        "max_lost_runs_ignored",
        "issue 33 #10: a step that takes its worker down every time loops for ever (OPENHUB_MAX_LOST_RUNS)",
        "openhub/core/states.py",
        "        if event is Event.LEASE_EXPIRED and lost_runs > max_lost_runs:\n",
        "        if event is Event.LEASE_EXPIRED and lost_runs > max_lost_runs * 1000:\n",
        guard="tests/integration/test_hub_faults.py",
    ),
    Mutation(
        "fenced_run_left_to_repair",
        "issue 33 #10: a fenced run leaves its lease to the repair (a lost run) instead of letting it go",
        "openhub/engine/engine.py",
        ("    drop_fenced(run, entered, step_ran=False)\n    return True\n"),
        "    return True  # reverted: left to the repair\n",
        guard="tests/integration/test_hub_faults.py::test_a_lease_the_fence_let_go_counts_nothing",
    ),
    Mutation(
        "fenced_entry_forgets_a_begun_call",
        "review of the fenced let-go: a run the fence stopped before its step ran deletes the step's call record, "
        "a call begun before it and never seen to end with it (the next run is not told redelivered)",
        "openhub/engine/leases.py",
        "    if before is None:\n        conn.execute(delete(ext_calls).where(mine, X.attempts == 1))\n",
        "    if True:  # reverted: the record goes, whatever the run found\n"
        "        conn.execute(delete(ext_calls).where(mine))\n",
        guard="tests/integration/test_promise_regressions.py",
    ),
    Mutation(
        "batch_with_every_member_stopped",
        "the fence in the model's search: a batch round whose every member stopped before its call (fenced) "
        "writes an empty group, and its task raises IndexError",
        "openhub/engine/batch.py",
        "    if not members:\n        return\n    saved = [copy.copy(m) for m in members]\n",
        "    saved = [copy.copy(m) for m in members]\n",
        guard="tests/integration/test_promise_regressions.py",
    ),
    # --- issue 33: broker (b26aa68, cb31d14, 01ebe72, 6fc0d38) and repair (f80aa42) -----------------------
    Mutation(
        "lost_chains_wait_lease_grace",
        "issue 33 #9: chains lost with the broker are published again only after OPENHUB_LEASE_GRACE",
        "openhub/engine/poller.py",
        "        if publisher.broker_marked() is not False:\n",
        "        if True:  # reverted: nobody looks at the broker's mark\n",
        guard="tests/integration/test_broker_queues.py",
    ),
    Mutation(
        "repair_first_page_only",
        "issue 33: the lost-run repair reads one page (500 rows) and no more",
        "openhub/engine/poller.py",
        "(rows[-1].updated_at, rows[-1].id) if len(rows) == BATCH else None\n",
        "None\n",
        guard="tests/integration/test_repair.py::test_a_dead_worker_with_more_runs_than_a_page_has_them_all_repaired_in_"
        "one_tick",
    ),
    Mutation(
        "redisbroker_connparams",
        "issue 33 #8: a channel's last close after a Redis restart kills the worker",
        "openhub/celery/redisbroker.py",
        "        return self._params[asynchronous]\n",
        "        return super()._connparams(asynchronous=asynchronous)\n",
        guard="tests/integration/test_redisbroker.py::test_a_channel_closed_after_its_connection_was_collected_does_not_"
        "raise",
    ),
    # --- issue 38: a sync route's result kept with its last call ------------------------------------------
    Mutation(
        "sync_result_lost_with_run",
        "issue 38: a sync route's last call succeeded in a run whose lease was lost (cancelled and restarted "
        "mid-call); the next run skips it as done and the message ends OK without a result",
        "openhub/engine/leases.py",
        "        if done.rowcount and verdict.result is not None:\n",
        "        if False and done.rowcount and verdict.result is not None:\n",
    ),
    # --- issue 33: one clock (1827567) --------------------------------------------------------------------
    Mutation(
        "store_now_process_clock",
        "issue 33 #4: stored times taken from each host's own clock on PostgreSQL",
        "openhub/store/db.py",
        ('    if url.startswith("sqlite"):\n        return utcnow()\n'),
        ("    if True:  # reverted: this host's clock\n        return utcnow()\n"),
        guard="tests/integration/test_one_clock.py::test_a_host_whose_wall_clock_is_off_tells_the_databases_time",
    ),
    # --- issue 33: confirmers (41b1548) -------------------------------------------------------------------
    Mutation(
        "confirm_lease_not_renewed",
        "issue 33 #7: a confirmer that outlasts its sending lease is sent again by another tick",
        "openhub/outbound/confirm.py",
        "        while not self._stop.wait(interval):\n",
        "        while False and not self._stop.wait(interval):\n",
        guard="tests/integration/test_slow_receivers.py::test_a_confirmer_that_outlasts_its_lease_is_called_once_while_"
        "ticks_go_on",
    ),
    # --- issue 33: the fence before every call (c8f9a14, 52e1972) ---------------------------------------------
    Mutation(
        "batch_member_called_after_cancel",
        "issue 33 #3, #6: a batch member's call made though it was cancelled, or its worker lost the store, "
        "while an earlier member's call ran",
        "openhub/engine/batch.py",
        "_run_one(m, still_held=i > 0)",
        "_run_one(m, still_held=False)",
        guard="tests/integration/test_batch.py::"
        "test_a_member_cancelled_while_an_earlier_members_call_runs_makes_no_call",
    ),
    Mutation(
        "heartbeat_a_greenlet",
        "issue 33 #5: under gevent the heartbeat is a greenlet, which a busy step starves",
        "openhub/store/workers.py",
        'start_new_thread = monkey.get_original("_thread", "start_new_thread") if monkey is not None else None',
        "start_new_thread = None",
        guard="tests/integration/test_gevent_pool.py::"
        "test_a_step_computing_past_dead_after_does_not_starve_the_heartbeat",
    ),
    Mutation(
        "call_fence_waits_for_three_quarters",
        "issue 33 #6: a call started after the heartbeat lost the store, until 3/4 of dead-after",
        "openhub/store/workers.py",
        (
            "    return (\n"
            "        fenced(since)\n"
            "        or _store_away\n"
            "        or time.monotonic() - _renewed > _settings.worker_dead_after.total_seconds() * CALL_FENCE\n"
            "        or not proved(_settings.database_url)\n"
            "    )\n"
        ),
        "    return fenced(since) or not proved(_settings.database_url)\n",
        guard="tests/unit/test_workers.py::test_a_call_is_refused_once_the_heartbeat_cannot_reach_the_store",
    ),
    Mutation(
        "call_sent_without_a_proof_of_the_store",
        "issue 33 #6 (its root): a call sent up to half of dead-after after the store was cut, on a heartbeat not "
        "yet overdue, not only within PROOF_AGE of a round trip of its process to the store",
        "openhub/store/workers.py",
        "        or not proved(_settings.database_url)\n    )\n",
        "    )\n",
        guard="tests/integration/test_proof.py::test_a_worker_cut_from_the_store_starts_no_call_past_the_proof_age",
    ),
    # --- issue 33: the fence re-applied (the causes of its revert, 8ca65a1) -----------------------------------
    Mutation(
        "batch_member_read_gives_up_on_outage",
        "issue 33 (fence): a batch member whose read before its call meets a store away is left to the repair, "
        "not waited out as the group's writes are",
        "openhub/engine/batch.py",
        ("        except StoreUnavailable as exc:\n            attempt += 1\n            log.warning(\n"),
        ("        except StoreUnavailable as exc:\n            return False  # reverted\n            log.warning(\n"),
        guard="tests/integration/test_promise.py::test_the_store_away_right_before_a_later_batch_members_call_is_"
        "waited_out",
    ),
    Mutation(
        "heartbeat_connection_opened_by_its_thread",
        "issue 33 (fence): the heartbeat thread opens its own connection at its first beat, a gap that fences "
        "the process's first calls on a loaded box",
        "openhub/store/workers.py",
        "beat(worker_id, node, url, broken=True, own=own)",
        "beat(worker_id, node, url, broken=True)",
        guard="tests/unit/test_workers.py::test_the_heartbeat_threads_connection_slow_to_open_fences_no_call",
    ),
    # --- issue 33: test_hosts' "OK, never confirmed" ------------------------------------------------------------
    Mutation(
        "handed_over_sending_row_left_alone",
        "issue 33 (test_hosts): a confirmation whose sender died mid-send, handed over to its task, is left alone "
        "by the task and handed over again each lease: never confirmed",
        "openhub/outbound/confirm.py",
        "C.state.in_((CS.PENDING, CS.FAILED, CS.SENDING)), C.claim == HANDED_OVER",
        "C.state.in_((CS.PENDING, CS.FAILED)), C.claim == HANDED_OVER",
        guard="tests/integration/test_promise.py::test_a_confirmation_whose_sender_died_mid_send_is_sent_by_the_"
        "task_it_is_handed_over_to",
    ),
    # --- issue 42, item 1: a batch's outcomes in one set statement (PostgreSQL) ------------------------------
    Mutation(
        "batch_set_write_without_cas",
        "issue 42 (set statements): a batch's one statement that writes its outcomes writes a member whose message "
        "was cancelled (or repaired) while its step ran: the outcome written, its next step called after the cancel",
        "openhub/engine/batch_writes.py",
        " AND messages.attempt_id = v.token AND messages.step_run = v.run\n"
        "        AND messages.state = '{State.PROCESSING.value}'\n",
        "\n",
        guard="tests/integration/test_batch.py::test_a_message_cancelled_while_its_batch_runs_stops_and_the_others_"
        "go_on",
    ),
    Mutation(
        "batch_set_claim_without_cas",
        "issue 42 (set statements): a batch's one statement that claims its members at the first step claims a "
        "message cancelled before the batch ran, or one whose chain was published again since (an old token)",
        "openhub/engine/batch_claims.py",
        "        AND messages.attempt_id = v.token AND messages.state IN "
        "('{State.NEW.value}', '{State.IN_QUEUE.value}')\n",
        "",
        guard="tests/integration/test_batch.py::test_a_batch_claims_no_member_cancelled_or_of_a_stale_chain_and_"
        "the_others_go_on",
    ),
    # --- issue 37, part 2: fan-out ----------------------------------------------------------------------------
    Mutation(
        "fan_out_family_restarted",
        "issue 37 (fan-out): an operator's restart of a family (OK from its accept) runs its topic's step, which "
        "has nothing to do, and fails the family",
        "openhub/service/actions.py",
        "    if is_topic(hub.registry.find_route_of(row)):",
        "    if False:",
        guard="tests/integration/test_fanout.py::test_each_of_three_subscribers_is_called_exactly_once",
    ),
    Mutation(
        "fan_out_receivers_unconfirmed",
        "issue 37 (fan-out): a family's receivers, whose ids the source system was answered with, are not "
        "confirmed to it",
        "openhub/core/topics.py",
        "bound=False, confirm_children=True)",
        "bound=False, confirm_children=False)",
        guard="tests/integration/test_fanout.py::test_each_receiver_is_confirmed_to_the_source_system_and_the_family_"
        "is_not",
    ),
    # --- issue 35, "one way in": two hubs in one process ----------------------------------------------------
    Mutation(
        "liveness_by_the_process_s_dead_after",
        "issue 35: a hub's poller judges the heartbeats in its store by the process's OPENHUB_WORKER_DEAD_AFTER "
        "(the installed hub's), so a process silent past the hub's own limit is alive to it",
        "openhub/store/workers.py",
        "    dead = dead_among(rows, dead_after)\n",
        "    from openhub.core.config import get_settings  # reverted: the process's\n"
        "    dead = dead_among(rows, get_settings().worker_dead_after)\n",
        guard="tests/integration/test_local_hub.py::test_each_of_two_hubs_judges_heartbeats_by_its_own_worker_dead_after",
    ),
    Mutation(
        "crash_beat_in_the_process_s_store",
        "issue 35: a LocalHub whose run crashed writes its heartbeat row into the process's store (the hub "
        "installed last), so its own row still vouches for the run and no tick repairs it",
        "openhub/testing.py",
        'beat(current_id(), "LocalHub", self.hub.settings.database_url)',
        'beat(current_id(), "LocalHub", __import__("openhub.engine.hub").engine.hub.current().settings.database_url)',
        guard="tests/integration/test_local_hub.py::test_a_crashed_run_of_the_first_of_two_hubs_is_repaired_in_its_own_store",
    ),  # --- issue 42's single-statement hop, reviewed (fixed in 4051d51, 0a87623) ------------------------------
    Mutation(
        "single_statement_fence_start_after_commit",
        "issue 42 review: a run entered in one statement reads its fence start after the statement committed, "
        "so a heartbeat gap that ended while the answer travelled does not fence it and it calls beside the "
        "run that repaired it",
        "openhub/engine/entry.py",
        "            row, inserted = leases.take_new(conn, run, leases.lease(item, run_id, tx.now, hub.settings), tx.now)\n"
        "    if row is None:\n",
        "            row, inserted = leases.take_new(conn, run, leases.lease(item, run_id, tx.now, hub.settings), tx.now)\n"
        "    started = time.monotonic()  # reverted: the start read once the statement committed\n"
        "    if row is None:\n",
        guard="tests/integration/test_single_statement_fence.py",
    ),
    Mutation(
        "single_statement_entry_without_cas",
        "issue 42 review: the entry's second transaction after a lease taken without its call record writes "
        "without re-checking the lease, so a cancel that came in between is overwritten (CANCEL ends OK)",
        "openhub/engine/entry.py",
        "            if row is None or (row.attempt_id, row.step_run, row.state) != (run.token, run_id, State.PROCESSING):\n",
        "            if row is None:  # reverted: the lease is not checked again\n",
        guard="tests/integration/test_single_statement_entry_race.py",
    ),
]


def by_name(name: str) -> Mutation:
    """The mutation called `name`."""
    for mutation in MUTATIONS:
        if mutation.name == name:
            return mutation
    raise KeyError(f"no mutation {name!r}; known: {', '.join(m.name for m in MUTATIONS)}")
