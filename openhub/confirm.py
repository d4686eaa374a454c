"""Confirming final messages to their source systems (OK, FAILED, CANCEL).

A confirmation is a row written in the same transaction as the final state, so it cannot be
forgotten; it is sent right after commit and, if the confirmer fails, retried by the poller
every OPENHUB_CONFIRM_INTERVAL up to OPENHUB_CONFIRM_MAX_FAILS, then parked as FAILED_END.
Sending claims the row first (compare-and-set), so one final state is confirmed once.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, insert, select, update

from .config import get_settings
from .context import MessageView
from .db import transaction, utcnow
from .registry import get_registry
from .schema import confirmations
from .store import message_view

log = logging.getLogger("openhub.confirm")
C = confirmations.c
PENDING, SENDING, OK, FAILED, FAILED_END = "PENDING", "SENDING", "OK", "FAILED", "FAILED_END"


@dataclass(frozen=True)
class Outcome:
    """What a confirmer receives: the message, its final state and its business errors."""

    message: MessageView
    state: str
    business_errors: list[dict[str, str]]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for sending to the source system."""
        m = self.message
        return {"id": m.id, "correlation_id": m.correlation_id, "source_system": m.source_system,
                "route": m.route, "process_id": m.process_id, "state": self.state,
                "business_errors": self.business_errors, "failed_error": _first_line(m.failed_error)}


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[-1] if text else None


def queue_confirmation(conn: Connection, message_id: int, outcome: str, now: datetime) -> None:
    """Record that the final `outcome` of a message must be confirmed (in the finishing transaction)."""
    conn.execute(insert(confirmations).values(message_id=message_id, outcome=outcome, state=PENDING, attempts=0,
                                              due_at=now, created_at=now, updated_at=now))


def send_confirmations(message_id: int | None = None, now: datetime | None = None, limit: int = 100) -> int:
    """Send due confirmations (of one message, or all due ones); returns how many were sent OK."""
    now = now or utcnow()
    # A confirmer may take as long as a step; a shorter lease would let another sender call it again.
    lease = max(get_settings().confirm_interval, get_settings().step_timeout)
    claim = str(uuid.uuid4())
    with transaction() as conn:
        query = select(C.id).where(and_(C.state.in_((PENDING, FAILED, SENDING)), C.due_at <= now))
        if message_id is not None:
            query = query.where(C.message_id == message_id)
        query = query.order_by(C.due_at).limit(limit)
        if conn.dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        ids = list(conn.execute(query).scalars())
        # Claim: a crashed sender's SENDING row becomes due again after the lease.
        if ids:
            conn.execute(update(confirmations).where(C.id.in_(ids))
                         .values(state=SENDING, claim=claim, due_at=now + lease, updated_at=now))
    sent = 0
    for confirmation_id in ids:
        sent += _send_one(confirmation_id, claim)
    return sent


def _send_one(confirmation_id: int, claim: str) -> int:
    settings = get_settings()
    with transaction() as conn:
        row = conn.execute(select(confirmations).where(C.id == confirmation_id)).one()
        view = message_view(conn, row.message_id)
    confirmer = get_registry().confirmers.get(view.source_system)
    error = None
    if confirmer is None:
        log.info("message %s (%s) ended %s; no confirmer for source system %s", view.id, view.correlation_id,
                 row.outcome, view.source_system)
    else:
        try:
            confirmer(Outcome(message=view, state=row.outcome, business_errors=view.business_errors))
        except Exception:  # noqa: BLE001 - any failure of the confirmer is retried
            error = traceback.format_exc()
            log.warning("confirmation of message %s to %s failed: %s", view.id, view.source_system,
                        _first_line(error))
    now = utcnow()
    attempts = row.attempts + 1
    if error is None:
        values = dict(state=OK, due_at=None)
    elif attempts >= settings.confirm_max_fails:
        values = dict(state=FAILED_END, due_at=None, last_error=error)
    else:
        values = dict(state=FAILED, due_at=now + settings.confirm_interval, last_error=error)
    with transaction() as conn:
        conn.execute(update(confirmations).where(and_(C.id == confirmation_id, C.state == SENDING,
                                                      C.claim == claim))
                     .values(attempts=attempts, updated_at=now, **values))
    return int(error is None)


def list_confirmations(state: str | None = None, message_id: int | None = None,
                       limit: int = 100) -> list[dict[str, Any]]:
    """Confirmations, newest first; `state="FAILED_END"` lists the parked ones for operators."""
    query = select(confirmations).order_by(C.id.desc()).limit(limit)
    if state is not None:
        query = query.where(C.state == state)
    if message_id is not None:
        query = query.where(C.message_id == message_id)
    with transaction() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]

