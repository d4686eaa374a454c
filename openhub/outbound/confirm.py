"""Confirming final messages to their source systems (OK, FAILED, CANCEL), and calling state hooks.

A confirmation is a row written in the same transaction as the final state, so it cannot be
forgotten; it is sent right after commit and, if the confirmer fails, retried by the poller
every OPENHUB_CONFIRM_INTERVAL up to OPENHUB_CONFIRM_MAX_FAILS, then parked as FAILED_END.
Sending claims the row first (compare-and-set), so one final state is confirmed once. A state
hook's notification (@on_state, the stock webhook) is a row of the same table naming its hook,
sent and retried the same way.

Why no confirmation or hook is sent by two senders at once, however long its confirmer takes (issue 33):
a claim is a sending lease (the row's `due_at`), and another sender (a poller tick) takes a SENDING row
over only once that lease has run out. While the confirmer runs, the lease is renewed (`_Sending`, a
fifth of it at a time), so it runs out only when its sender stopped renewing it: the process died, stalled,
or lost the store for a whole lease. And a sender starts its confirmer only while its lease, as last
renewed, has more than a quarter left (`_Sending.held`), so a sender that stalled between its claim and
the call does not call beside the one that took over. A confirmer that was already calling when its
process stalled or was cut off past the lease is called again by the next sender, with the same
delivery id, as a step's call in flight is (README). Where the worker can interrupt a call (the main
thread of a prefork or solo worker, a greenlet under gevent: the `deadline` tasks/ gives), every
confirmer also has an overall deadline, OPENHUB_CONFIRM_TIMEOUT: past it, the send counts as failed and
is tried again later, so a hung confirmer cannot hold a worker (or a poller tick) for good. A thread (a
LocalHub's, the API's resend) cannot be interrupted: there the renewed lease alone keeps the promise.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, Callable

from sqlalchemy import Connection, and_, insert, or_, select, update

from openhub.core.config import Settings
from openhub.core.context import Outcome, error_line
from openhub.core.errors import InputError, NotFound, StateConflict, StoreUnavailable
from openhub.core.policy import confirmation_lease, confirmation_renewal, confirmation_retry, outage_pause
from openhub.core.redact import redact_text
from openhub.core.registry import Confirmer, Registry
from openhub.core.runs import TimeLimit
from openhub.core.states import ConfirmationState as CS
from openhub.core.tracing import failed, message_span
from openhub.store import audit
from openhub.store.db import store_clock, store_now, transaction
from openhub.store.queries import message_view, refuse_control
from openhub.store.schema import confirmations, messages
from openhub.store.workers import call_fenced

log = logging.getLogger("openhub.confirm")
C = confirmations.c
SENDING_FENCE = 0.75  # of the sending lease: a sender whose last renewal is older starts no confirmer
# The claim of a due confirmation the poller handed to an `openhub.confirm` task (OPENHUB_CONFIRM_QUEUE): the
# task sends it whatever its due time, which the hand-over moved on by a sending lease, so the next ticks do
# not hand it over again while the task waits in its queue (and do, once that lease is over).
HANDED_OVER = "handed-over"


def queue_confirmation(conn: Connection, message_id: int, outcome: str, now: datetime) -> None:
    """Record that the final `outcome` of a message must be confirmed (in the finishing transaction)."""
    conn.execute(
        insert(confirmations).values(
            message_id=message_id,
            outcome=outcome,
            state=CS.PENDING,
            attempts=0,
            due_at=now,
            created_at=now,
            updated_at=now,
        )
    )


def send_confirmations(
    message_id: int | None = None,
    now: datetime | None = None,
    limit: int = 100,
    budget: float | None = None,
    deadline: TimeLimit | None = None,
    *,
    settings: Settings,
    registry: Registry,
) -> int:
    """Send due confirmations (of one message, or all due ones); returns how many were sent OK.

    With `budget` (seconds), no further one is claimed once that much time is spent: the rest stay
    due for the next call, so a few slow receivers cannot stretch one poller tick without end.
    `deadline`: how the driver interrupts a confirmer past OPENHUB_CONFIRM_TIMEOUT (None: it cannot).
    `settings`, `registry`: the sending hub's (the confirm task's, the poller's, the follow-ups').
    """
    url = settings.database_url
    now = now or store_now(url)
    # A confirmer may take as long as a step, a webhook up to its deadline: a shorter lease would let
    # another sender call it again while the first still sends.
    lease = confirmation_lease(settings)
    with transaction(url) as conn:
        query = select(C.id).where(_sendable(conn, now))
        if message_id is not None:
            query = query.where(C.message_id == message_id)
        ids = list(conn.execute(query.order_by(C.due_at).limit(limit)).scalars())
    started = time.monotonic()
    sent = 0
    for confirmation_id in ids:
        if budget is not None and time.monotonic() - started >= budget:
            break
        # Each one is claimed just before it is sent, its lease starting then: a lease covering a whole
        # batch ran out under a slow confirmer while the batch's tail still waited, and a second sender
        # sent that tail too. A crashed sender's SENDING row becomes due again when its lease ends.
        sending = _Sending(confirmation_id, lease, now + timedelta(seconds=time.monotonic() - started), url)
        with transaction(url) as conn:
            taken = conn.execute(
                update(confirmations)
                .where(and_(C.id == confirmation_id, _sendable(conn, sending.claimed_at)))
                .values(
                    state=CS.SENDING,
                    claim=sending.claim,
                    updated_at=sending.claimed_at,
                    due_at=store_clock(conn, sending.claimed_at) + lease,
                )
            ).rowcount
        if taken:
            with sending:
                sent += _send_one(confirmation_id, sending, deadline, settings, registry)
    return sent


class _Sending:
    """A claimed confirmation's sending lease, renewed while its confirmer runs (module doc).

    Renewed from a thread of its own (a greenlet under gevent), by a compare-and-set on the claim, on the
    clock the claim was written with (the database's on PostgreSQL). `held` is what a sender asks before
    it calls: whether the lease, as last renewed, still has more than a quarter of it left.
    """

    def __init__(self, confirmation_id: int, lease: timedelta, claimed_at: datetime, url: str) -> None:
        self.confirmation_id, self.lease, self.claimed_at, self.url = confirmation_id, lease, claimed_at, url
        self.claim = str(uuid.uuid4())
        self._claimed = self._renewed = time.monotonic()  # each renewal's statement begins after this
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="openhub-confirmation-lease")

    def __enter__(self) -> _Sending:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        # A renewal still under way is harmless once the outcome is written (it renews only a SENDING row).
        self._thread.join(timeout=5)

    def held(self) -> bool:
        """Whether the sending lease surely still holds (no other sender can have taken the row over)."""
        return time.monotonic() - self._renewed < SENDING_FENCE * self.lease.total_seconds()

    def _renew(self) -> None:
        interval = confirmation_renewal(self.lease)
        while not self._stop.wait(interval):
            began = time.monotonic()
            now = self.claimed_at + timedelta(seconds=began - self._claimed)  # the claim's clock, moved on
            try:
                with transaction(self.url) as conn:
                    held = conn.execute(
                        update(confirmations)
                        .where(and_(C.id == self.confirmation_id, C.claim == self.claim, C.state == CS.SENDING))
                        .values(due_at=store_clock(conn, now) + self.lease)
                    ).rowcount
            except Exception as exc:
                log.warning("confirmation %s: renewing its sending lease failed (%s)", self.confirmation_id, exc)
                continue
            if not held:  # sent and recorded meanwhile, or (the lease ran out) taken over
                return
            self._renewed = began


def _due(conn: Connection, now: datetime) -> Any:
    """Due to be sent at `now` (the sender's time): a PENDING or FAILED confirmation by its due time, and a
    SENDING one whose sending lease is over.

    A sending lease is written and ended on one clock, the database's on PostgreSQL: on each sender's
    own, one whose clock is behind wrote a lease already over for the others, and one ahead took a
    lease still running, and the confirmation was sent twice (issue 22); and a poller whose clock is
    behind picked a crashed sender's confirmation that much later.
    """
    return or_(
        and_(C.state.in_((CS.PENDING, CS.FAILED)), C.due_at <= now),
        and_(C.state == CS.SENDING, C.due_at <= store_clock(conn, now)),
    )


def _sendable(conn: Connection, now: datetime) -> Any:
    """Due (`_due`), or handed over to a task of its own by the poller and not yet sent (`HANDED_OVER`).

    A handed-over row may be SENDING: a sender died (or stalled past its lease) while sending it, and the
    hand-over replaced that sender's claim. Taking only PENDING and FAILED ones, the task left such a row
    alone, and each tick a lease later handed it over again: never confirmed (issue 33).
    """
    return or_(_due(conn, now), and_(C.state.in_((CS.PENDING, CS.FAILED, CS.SENDING)), C.claim == HANDED_OVER))


def hand_over_due(now: datetime, publish: Callable[[int], bool], settings: Settings, limit: int = 100) -> int | None:
    """Hand the due confirmations (of up to `limit` rows) to `openhub.confirm` tasks, one per message, with
    `publish` (the publisher's `publish_confirmation`); how many messages' were handed over. None when
    `publish` has no task to hand them to (LocalHub): the caller sends them itself.

    The poller's tick runs on the step workers' queue: sending there, one slow receiver held a step's
    worker process for up to OPENHUB_CONFIRM_TIMEOUT each tick. A handed-over row is due again only after
    a sending lease (its task sends it meanwhile), so a queue of waiting tasks does not grow each tick.
    """
    with transaction(settings.database_url) as conn:
        rows = conn.execute(select(C.id, C.message_id).where(_due(conn, now)).order_by(C.due_at).limit(limit)).all()
    handed: list[int] = []
    for message_id in dict.fromkeys(r.message_id for r in rows):
        try:
            if not publish(message_id):
                return None
        except Exception as exc:
            log.warning("could not hand the confirmations of message %s to their task: %s", message_id, exc)
            continue
        handed.append(message_id)
    if handed:
        lease = confirmation_lease(settings)
        with transaction(
            settings.database_url
        ) as conn:  # a row its task claimed meanwhile is no longer due: left as it is
            conn.execute(
                update(confirmations)
                .where(and_(C.id.in_([r.id for r in rows if r.message_id in handed]), _due(conn, now)))
                .values(claim=HANDED_OVER, due_at=now + lease)
            )
    return len(handed)


def _send_one(
    confirmation_id: int, sending: _Sending, deadline: TimeLimit | None, settings: Settings, registry: Registry
) -> int:
    claim = sending.claim
    with transaction(settings.database_url) as conn:
        row = conn.execute(select(confirmations).where(C.id == confirmation_id)).one()
        view = message_view(conn, row.message_id)
    confirmer: Confirmer | None
    if row.hook is not None:  # a state hook's notification
        registered = registry.hooks.get(row.hook)
        confirmer = registered[1] if registered is not None else _missing(row.hook)
    else:
        confirmer = registry.confirmers.get(view.source_system)
    error = None
    hook = f"hook {row.hook}" if row.hook else None  # a hook's span and log say which; a confirmation's, to whom
    if confirmer is None:
        log.info(
            "message %s (%s) ended %s; no confirmer for source system %s",
            view.id,
            view.correlation_id,
            row.outcome,
            view.source_system,
        )
    elif not sending.held() or call_fenced(float("inf")):
        # Stalled since the claim (another sender may have it now), or this process's heartbeat fell behind
        # (others may judge it dead, and the store may be away): left to the next sender.
        log.warning(
            "%s of message %s not sent: its sending lease may have run out (this process stalled, or the "
            "store was away); the next sender sends it",
            hook or f"confirmation to {view.source_system}",
            view.id,
        )
        return 0
    else:
        # In the message's trace (openhub.core.tracing): the confirmer's HTTP call is a child of this span.
        with message_span(
            hook or f"confirm {view.source_system}",
            view,
            view.traceparent,
            outcome=row.outcome,
            attempt=row.attempts + 1,
            hook=row.hook,
        ) as span:
            returned = False
            try:
                with deadline(settings.confirm_timeout.total_seconds()) if deadline else nullcontext():
                    confirmer(
                        Outcome(
                            message=view,
                            state=row.outcome,
                            business_errors=view.business_errors,
                            delivery_id=row.id,
                            delivery_key=row.delivery_key,
                            hook=row.hook,
                            settings=settings,
                        )
                    )
                    returned = True  # a deadline arriving after this is too late to undo the send
            except Exception:
                if not returned:
                    error = redact_text(traceback.format_exc())  # a webhook URL's credentials stay out of it
                    log.warning(
                        "%s of message %s failed: %s",
                        hook or f"confirmation to {view.source_system}",
                        view.id,
                        error_line(error),
                    )
                    failed(span, error_line(error))
    now = store_now(settings.database_url)
    attempts = row.attempts + 1
    own = None if row.hook else registry.confirm_retries.get(view.source_system)  # its system's policy
    retry = (
        None
        if error is None
        else confirmation_retry(attempts, now, settings, getattr(confirmer, "endpoint", None), own)
    )
    values: dict[str, Any]
    if error is None:
        values = dict(state=CS.OK, due_at=None)
    elif retry is None:  # its attempts ran out: parked until an operator resends it
        values = dict(state=CS.FAILED_END, due_at=None, last_error=error)
    else:
        values = dict(state=CS.FAILED, due_at=retry, last_error=error)
    # The source system has its answer: the outcome is recorded through a store outage, however long
    # (a confirmation left SENDING would be sent again when its lease ends).
    attempt = 0
    while True:
        try:
            with transaction(settings.database_url) as conn:
                conn.execute(
                    update(confirmations)
                    .where(and_(C.id == confirmation_id, C.state == CS.SENDING, C.claim == claim))
                    .values(attempts=attempts, updated_at=now, **values)
                )
            return int(error is None)
        except StoreUnavailable as exc:
            attempt += 1
            log.warning("confirmation of message %s: recording failed (%s); trying again", view.id, exc)
            time.sleep(outage_pause(attempt))


def _missing(name: str) -> Confirmer:
    def missing(outcome: Outcome) -> None:
        raise LookupError(f"no state hook named {name!r} is loaded (OPENHUB_ROUTES, OPENHUB_WEBHOOK_URL)")

    return missing


def list_confirmations(
    state: str | None = None,
    message_id: int | None = None,
    source_system: str | None = None,
    limit: int = 100,
    *,
    settings: Settings,
) -> list[dict[str, Any]]:
    """Confirmations with their message's source system and correlation id, newest first;
    `state="FAILED_END"` lists the parked ones for operators. In the store of the hub whose `settings` are
    given (the API's served hub; openhub.service.confirmations gives the caller's, else the process's)."""
    if state is not None and state not in CS.__members__:
        raise InputError(f"unknown confirmation state {state!r}: one of {', '.join(CS)}")
    refuse_control(source_system=source_system)
    M = messages.c
    query = (
        select(confirmations, M.source_system, M.correlation_id)
        .join(messages, M.id == C.message_id)
        .order_by(C.id.desc())
        .limit(max(1, min(int(limit), 1000)))
    )
    if state is not None:
        query = query.where(C.state == state)
    if message_id is not None:
        query = query.where(C.message_id == message_id)
    if source_system is not None:
        query = query.where(M.source_system == source_system)
    with transaction(settings.database_url) as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def resend(confirmation_id: int, *, settings: Settings, registry: Registry) -> dict[str, Any]:
    """Send a parked (FAILED_END) confirmation again now, with a fresh round of attempts; the row after.
    By the hub whose `settings` and `registry` are given (the API's served hub, openhub.service.confirmations')."""
    with transaction(settings.database_url) as conn:
        row = conn.execute(select(C.state, C.message_id).where(C.id == confirmation_id)).first()
        if row is None:
            raise NotFound(f"no confirmation with id {confirmation_id}")
        if row.state != CS.FAILED_END:
            raise StateConflict(
                f"confirmation {confirmation_id} is {row.state}: only a parked (FAILED_END) one is sent again"
            )
        now = store_now(settings.database_url)
        _unpark(conn, C.id == confirmation_id, now)
        audit.record(
            conn,
            "confirmation.resend",
            target=f"confirmation {confirmation_id}",
            message_ids=[row.message_id],
            now=now,
        )
    send_confirmations(row.message_id, settings=settings, registry=registry)
    listed = list_confirmations(message_id=row.message_id, limit=1000, settings=settings)
    return next(c for c in listed if c["id"] == confirmation_id)


def resend_parked(source_system: str | None = None, *, settings: Settings) -> list[int]:
    """Make every parked confirmation (of one source system) due again; the poller sends them. Their ids.
    In the store of the hub whose `settings` are given (the API's served hub, openhub.service.confirmations')."""
    refuse_control(source_system=source_system)
    where = C.state == CS.FAILED_END
    if source_system is not None:
        where = and_(where, C.message_id.in_(select(messages.c.id).where(messages.c.source_system == source_system)))
    with transaction(settings.database_url) as conn:
        now = store_now(settings.database_url)
        ids = sorted(_unpark(conn, where, now))
        messages_of = list(conn.execute(select(C.message_id).where(C.id.in_(ids))).scalars()) if ids else []
        audit.record(
            conn,
            "confirmation.resend_parked",
            target=f"source system {source_system}" if source_system else "every source system",
            message_ids=messages_of,
            new={"resent": ids},
            now=now,
        )
        return ids


def _unpark(conn: Connection, where: Any, now: datetime) -> list[int]:
    return list(
        conn.execute(
            update(confirmations)
            .where(and_(where, C.state == CS.FAILED_END))
            .values(state=CS.PENDING, attempts=0, due_at=now, claim=None, updated_at=now)
            .returning(C.id)
        ).scalars()
    )
