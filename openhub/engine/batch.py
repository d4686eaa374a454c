"""Carrying many messages of one route through it in one task, step by step in lockstep (`Route(batch=N)`).

Each step of the batch goes in three parts, as one message's step does in openhub.engine.engine, but for all
the batch's messages at once:

1. enter: ONE transaction takes every message's step lease (or claims it, at its first step), in
   message-id order (two batches lock rows in the same order, never crosswise); where one message's
   part fails, the transaction is rolled back and written again with each part in a savepoint of its
   own, so the failure rolls back only its own part (savepoints from the start would cost two
   statements more per message and step, for a failure that is rare); on PostgreSQL the members at the
   route's first step are claimed in ONE statement (openhub.engine.batch_claims), a member it did not
   claim entered alone;
2. run: the entered steps, outside any transaction; as greenlets under gevent (each with its own step
   time limit), else one after another (SIGALRM, the prefork pool's step limit, needs the main thread);
3. write: ONE transaction records every outcome (again in savepoints where a part failed): a success
   hands the message over to its next step's lease in the same statement (`engine.record_and_enter`),
   anything else is recorded (`recording.record`); on PostgreSQL every member's compare-and-set is in
   ONE statement (openhub.engine.batch_writes), a member whose lease was lost written alone.

Every guarantee stays per message, written by the engine's own functions: lease and fencing token,
external-call record, retry, funnel, order, entity scope, cancel, expiry, splits, waits. A write that
fails for one message falls back as `engine` does (recorded alone, then as a transient failure
"UNRECORDED", then left to the lease repair) without touching the others. A store outage loses the
whole group transaction: it is tried again, whole, after a pause, for as long as this process lives
(each write is a compare-and-set on the message's lease: a second try writes what the first would
have). What committed asks for afterwards is carried out once the batch ends, also when it failed.

What lockstep costs: a message waits at each step for the slowest of its batch (bounded by the step's
timeout), and under prefork for the steps of the messages before it.
"""

from __future__ import annotations

import copy
import logging
import traceback
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from functools import partial
from typing import Any, Callable

from sqlalchemy import select

from openhub.core.concurrency import green
from openhub.core.errors import Fenced, StepFailed, StoreUnavailable
from openhub.core.policy import outage_pause
from openhub.core.runs import Entered, StepRun, TimeLimit
from openhub.core.states import State
from openhub.core.verdicts import StepReport, Verdict
from openhub.engine.batch_claims import claim_all
from openhub.engine.batch_members import Member, skipped_or_stopped
from openhub.engine.batch_writes import write_together
from openhub.engine.engine import (
    fenced_in_call,
    interrupted,
    left_to_repair,
    outcome,
    pause_before_retry,
    record_and_enter,
)
from openhub.engine.entry import enter, prepare
from openhub.engine.followups import carry_out
from openhub.engine.hub import Hub, given
from openhub.engine.lifecycle import FollowUps, Tx
from openhub.engine.recording import record
from openhub.store.db import is_outage, is_postgres
from openhub.store.schema import messages

__all__ = ["run_batch", "summary"]

M = messages.c
log = logging.getLogger("openhub.batch")


def run_batch(
    route_name: str,
    start: int,
    pairs: Sequence[tuple[int, str]],
    redelivered: bool = False,
    hub: Hub | None = None,
    limit: TimeLimit | None = None,
    *,
    translate: Callable[[BaseException], BaseException] | None = None,
) -> dict[int, StepReport]:
    """Carry each (message id, fencing token) of `pairs` from step `start` to the end of the route;
    each message's last report, by message id, in `hub` (default: the process's).

    StoreUnavailable while entering the first step, before any lease is taken, is raised (the task
    tries again later); after that the batch waits for the store instead.
    """
    hub = given(hub)  # the driver's hub: its routes, settings and clock (LocalHub moves the clock)
    hub.refresh()  # an admin's live settings (openhub.core.live), read at most every half poll interval
    route = hub.registry.route(route_name)
    options = {} if translate is None else {"translate": translate}
    members = [
        Member(StepRun(route, start, message_id, token, hub, redelivered, limit, **options))
        for message_id, token in sorted(pairs)
    ]
    follow = FollowUps()
    try:
        with ExitStack() as runs:  # each member's runs listed in this process's heartbeat while it holds them
            for m in members:
                runs.callback(m.unlist, everything=True)
            first = True
            while True:
                _enter_all(members, follow, first)
                first = False
                entered = [m for m in members if not m.done and isinstance(m.entered, Entered)]
                if not entered:
                    break
                _run_all(entered)
                _write_all([m for m in entered if m.verdict is not None], follow)
                for m in entered:  # a step recorded (or handed over), or a member stopped: its run has ended
                    m.unlist()
    finally:  # also when the store went away meanwhile: what committed is carried out
        carry_out(hub, follow, hub.clock())
    return {m.run.message_id: m.report for m in members}


# --- entering ------------------------------------------------------------------------------------------------


def _enter_all(members: list[Member], follow: FollowUps, first: bool) -> None:
    """Enter the step of every member that has to, in one transaction per round; a member whose step
    was done before (or that stops) is settled and, where it goes on, enters its next step next round."""
    while waiting := [m for m in members if not m.done and m.entered is None]:
        for m in waiting:
            m.run_id = m.run_id or m.new_run()  # listed before its lease is taken
        _group(waiting, follow, _enter_one, raise_outage=first, together=_enter_together)
        first = False  # the members settled below may hold leases from now on
        for m in waiting:
            if not isinstance(m.entered, Entered):
                _settle(m, skipped_or_stopped(bool(m.entered)))
            m.unlist()


def _enter_together(tx: Tx, members: list[Member]) -> list[Member]:
    """PostgreSQL: the members at the route's first step claimed in ONE statement, each under its own
    compare-and-set (openhub.engine.batch_claims); the rest (a member it did not claim: a stale chain,
    a refusal, a retry) are left to `_enter_one`."""
    firsts = [m for m in members if m.run.index == 0]
    claimed = {
        id(m): got
        for m, got in zip(firsts, _together(tx, firsts, "claiming", lambda: claim_all(tx, [_run(m) for m in firsts])))
        if got is not None and got[0] is not None
    }
    for m in firsts:
        if id(m) in claimed:
            row, taken = claimed[id(m)]
            write = partial(prepare, run=m.run, row=row, run_id=_run(m)[1], call_taken=taken)
            _entered(m, _write_part(tx, m, "entering", write, False)[0])
    return [m for m in members if id(m) not in claimed]


def _run(m: Member) -> tuple[StepRun, str]:
    assert m.run_id is not None
    return m.run, m.run_id


def _enter_one(tx: Tx, m: Member, careful: bool) -> None:
    run_id = m.run_id
    assert run_id is not None
    _entered(m, _write_part(tx, m, "entering", partial(enter, run=m.run, run_id=run_id), careful)[0])


def _entered(m: Member, entered: Entered | bool | None) -> None:
    if entered is None:  # nothing of it written: its message is re-driven by the lease or lost-chain repair
        m.stop()
        return
    m.entered, m.run_id = entered, None


def _settle(m: Member, report: StepReport, handed: Entered | bool | None = None) -> None:
    """A member's step came to `report`: it ends here, or goes on to its next step (entered already
    when `handed` over to it; where the hand-over found that step done before, or stopped there, as
    `enter` would have, it is settled in turn, as engine's `_carry_through` does)."""
    m.report, m.verdict = report, None
    if not report.go_on or m.run.last:
        m.done = True
        return
    m.run, m.entered = m.run.next(), None
    if isinstance(handed, bool):
        _settle(m, skipped_or_stopped(handed))
    else:
        m.entered = handed


# --- running -------------------------------------------------------------------------------------------------


def _run_all(members: list[Member]) -> None:
    """Run the entered steps: concurrently as greenlets under gevent, else one after another.

    The greenlets end with this call, also where it is stopped (Celery's hard limit under gevent is a
    gevent.Timeout in the task's greenlet; a revoke): none may go on calling out once the runs are
    unlisted and the repair may run the step again."""
    if green() and len(members) > 1:
        from gevent.pool import Pool  # type: ignore[import-untyped]

        pool = Pool(len(members))
        try:
            pool.map(_run_one, members)
        finally:
            pool.kill(block=True)
    else:
        for i, m in enumerate(members):
            _run_one(m, still_held=i > 0)


def _run_one(m: Member, still_held: bool = False) -> None:
    """Run the member's step; `still_held`: its lease is read first, as earlier members' calls ran since it
    was taken (a member cancelled meanwhile, or whose lease was taken over, makes no call)."""
    assert isinstance(m.entered, Entered)
    if left_to_repair(m.run, m.entered):
        m.stop()
        return
    try:
        held = not still_held or _still_held(m)
    except Exception as exc:
        if not interrupted(m.run, exc):
            raise
        log.warning(
            "message %s: step %s not run: Celery's time limit came before its call; left to the repair",
            m.run.message_id,
            m.run.item.key,
        )
        held = False
    if not held:
        m.stop()
        return
    try:
        m.verdict = outcome(m.run, m.entered)
    except Fenced:
        fenced_in_call(m.run, m.entered)
        m.stop()
    except Exception:
        log.exception(
            "message %s: step %s crashed outside the step; its lease is repaired", m.run.message_id, m.run.item.key
        )
        m.stop()


def _still_held(m: Member) -> bool:
    """Whether the member's message is still PROCESSING under its lease (not cancelled, not taken over by a
    repair): read just before its call, in a transaction that only reads (no commit: the group's step
    still commits once). A store that is away is waited for, as the group's writes wait (a call made now
    could not be recorded, and a repair might make it again); given up once this process is fenced
    meanwhile (others may have judged it dead: left to the repair); Celery's soft time limit is raised."""
    assert isinstance(m.entered, Entered)
    attempt = 0
    while True:
        try:
            with m.run.hub.reading() as conn:
                row = conn.execute(select(M.state, M.attempt_id, M.step_run).where(M.id == m.run.message_id)).first()
            break
        except StoreUnavailable as exc:
            attempt += 1
            log.warning(
                "message %s: step %s waits for the store before its call (%s)", m.run.message_id, m.run.item.key, exc
            )
            if left_to_repair(m.run, m.entered):
                return False
            pause_before_retry(outage_pause(attempt))
    if row is not None and (row.state, row.attempt_id, row.step_run) == (
        State.PROCESSING.value,
        m.run.token,
        m.entered.run_id,
    ):
        return True
    log.info(
        "message %s: step %s not run: its message moved on while the batch's earlier calls ran (%s)",
        m.run.message_id,
        m.run.item.key,
        row.state if row is not None else "gone",
    )
    return False


# --- writing -------------------------------------------------------------------------------------------------


def _write_all(members: list[Member], follow: FollowUps) -> None:
    for m in members:
        verdict = m.verdict
        assert verdict is not None
        if verdict.event is None and not m.run.last:
            m.run_id = m.run_id or m.new_run()  # the next step's, taken in the statement that records this one
    _group(members, follow, _write_one, together=_write_together)


def _write_together(tx: Tx, members: list[Member]) -> list[Member]:
    """PostgreSQL: the members' outcomes in ONE statement, each under its own compare-and-set (openhub.engine.
    batch_writes), then the rest of each one's write; those whose lease was lost are left to `_write_one`."""
    rests = _together(tx, members, "writing", lambda: write_together(tx, [_step(m) for m in members]))
    for m, rest in zip(members, rests):
        if rest is not None and m.verdict is not None:  # as `_write_one`: handed over, or recorded
            verdict, handing_over, (result, _) = m.verdict, m.run_id, _write_part(tx, m, "writing", rest, False)
            m.run_id = None
            _settle(m, *((StepReport(True, "ok"), result) if handing_over else (StepReport.of(verdict, result),)))
    return [m for m, rest in zip(members, rests) if rest is None]


def _together(tx: Tx, members: list[Member], what: str, write: Callable[[], list[Any]]) -> list[Any]:
    """`write`'s one statement for all `members` on PostgreSQL (a list of what it wrote, per member); on SQLite
    (or for one member) nothing, a None per member. A failure that is not the store's rolls the group back:
    it is written again, each member alone (`_Redo`)."""
    if len(members) < 2 or not is_postgres(tx.conn):
        return [None] * len(members)
    try:
        return write()
    except Exception as exc:
        if is_outage(exc) or isinstance(exc, StoreUnavailable) or interrupted(members[0].run, exc):
            raise
        raise _Redo(f"batch of {len(members)}, message {members[0].run.message_id} first: {what}") from exc


def _step(m: Member) -> tuple[StepRun, Entered, Verdict, str | None]:
    assert isinstance(m.entered, Entered) and m.verdict is not None
    return m.run, m.entered, m.verdict, m.run_id


def _write_one(tx: Tx, m: Member, careful: bool) -> None:
    """Record the member's step as its own part of the group's transaction, falling back as `engine` does:
    a success that could not be handed over is recorded alone, a record that failed is replaced by a
    transient failure "UNRECORDED", and where that fails too the lease repair takes over."""
    entered, verdict = m.entered, m.verdict
    assert isinstance(entered, Entered) and verdict is not None
    next_run = m.run_id
    if next_run is not None:
        handed, _ = _write_part(
            tx,
            m,
            "handing over",
            partial(record_and_enter, run=m.run, entered=entered, verdict=verdict, next_run=next_run),
            careful,
        )
        if handed is not None:
            m.run_id = None
            _settle(m, StepReport(True, "ok"), handed)
            return
    while True:
        go_on, failure = _write_part(
            tx, m, "recording", partial(record, run=m.run, entered=entered, verdict=verdict), careful
        )
        if go_on is not None:
            _settle(m, StepReport.of(verdict, go_on))
            return
        if verdict.unrecorded:  # the fallback failed too
            m.stop()
            return
        verdict = verdict.unrecordable(m.run.item.key, failure)


class _Redo(Exception):
    """A message's write failed outside a savepoint: the group's transaction is written again, carefully."""


def _write_part(tx: Tx, m: Member, what: str, write: Callable[[Tx], Any], careful: bool) -> tuple[Any, str]:
    """`write`, one message's part of the group's transaction, and what it returned; (None, the traceback)
    when it failed for this message alone. What it asks for after commit joins the group's on success.

    Only a `careful` group puts each part in a savepoint (two statements more each, a fifth of a step's):
    a part that fails in a group that is not raises `_Redo`, and the group is written again, carefully,
    so that the failure rolls back to its own savepoint and the others are written.
    """
    own = Tx(tx.conn, tx.now, FollowUps(), tx.hub)
    try:
        with tx.conn.begin_nested() if careful else nullcontext():
            result = write(own)
    except Exception as exc:
        if is_outage(exc) or isinstance(exc, StoreUnavailable) or interrupted(m.run, exc):
            raise  # the whole group's transaction is lost (or the task's limit came): tried again whole
        if not careful:
            raise _Redo(f"message {m.run.message_id}: {what} step {m.run.item.key} failed") from exc
        log.exception("message %s: %s step %s failed", m.run.message_id, what, m.run.item.key)
        return None, traceback.format_exc()
    tx.follow.merge(own.follow)
    return result, ""


def _group(
    members: list[Member],
    follow: FollowUps,
    each: Callable[[Tx, Member, bool], None],
    *,
    raise_outage: bool = False,
    together: Callable[[Tx, list[Member]], list[Member]] | None = None,
) -> None:
    """`each` for every member in ONE transaction, committed together (each member's part in a savepoint
    of its own only once a part failed: `_write_part`); a store outage (or Celery's soft time limit
    arriving meanwhile, also during the pause) rolls it back whole: paused and tried again whole, never
    given up while this process lives, unless `raise_outage` (no lease is held yet). No member: nothing
    to write (every member of the round stopped before its call: fenced, say)."""
    if not members:
        return
    saved = [copy.copy(m) for m in members]
    attempt, careful = 0, False  # savepoints only once a part failed (`_write_part`)
    while True:
        group = FollowUps()
        hub = members[0].run.hub
        try:
            with hub.transaction() as conn:
                tx = Tx(conn, hub.clock(), group, hub)
                # `together` writes what it can for all members at once (not once a part failed), `each` the rest
                for m in members if careful or together is None else together(tx, members):
                    each(tx, m, careful)
            follow.merge(group)
            return
        except Exception as exc:
            for m, state in zip(members, saved):  # what the rolled-back transaction made of them is undone
                m.restore(state)
            if isinstance(exc, _Redo):
                careful = True
                continue
            outage = isinstance(exc, StoreUnavailable)
            if not outage and not interrupted(members[0].run, exc):
                raise
            if outage and raise_outage:
                raise
            attempt += 1
            log.warning(
                "batch of %d message(s), message %s first: the store failed (%s); trying the whole group again",
                len(members),
                members[0].run.message_id,
                exc,
            )
            if outage:
                try:
                    pause_before_retry(outage_pause(attempt))
                except Exception as late:
                    if not interrupted(members[0].run, late):
                        raise
                    # Celery's soft time limit arrived during the pause: the steps are done, their
                    # outcomes wait in memory; written again at once (as engine's `_record_outcome`)


def summary(reports: dict[int, StepReport]) -> dict[str, int]:
    """What a batch task shows in Flower once everything is recorded: how many of its messages came to
    what (each message's history has the rest); `StepFailed` naming the messages whose step failed, as
    a step task raises it for its message."""
    failed = {message_id: report for message_id, report in reports.items() if report.failed}
    if failed:
        raise StepFailed(
            f"{len(failed)} of {len(reports)} message(s) failed a step: "
            + "; ".join(
                f"message {message_id}: {report.outcome}: {report.error or ''}".strip()
                for message_id, report in sorted(failed.items())
            )
        )
    return dict(Counter(report.outcome for report in reports.values()))
