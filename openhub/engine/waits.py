"""Answers bound to their wait: each ask of a step that waits for a response has a token, and an answer
is taken for the ask its token names, never for another and never by its content (issue 33).

An ask's token is the id of the step run that asks (`ctx.wait_token`): new for every run (a re-ask after
the response timeout, a retry, a restart get new ones), and named by the message row (`step_run`) while
the step runs, so an answer that comes before the step has recorded its wait is bound to it as well. A
row of `waits` is written for an ask when its step records the wait (`asked`), or earlier when its answer
comes first (`receive`); nothing is written for the steps that never wait.

What an answer with a token is (`receive`, under the message's row lock):
- for the open wait (the message WAITING_FOR_RES, and this its latest ask): taken, the route resumes;
- for the ask whose step still runs: kept for that ask alone; its wait, once recorded, takes it at once;
- for an ask already answered: a duplicate, whatever its content or key order: noted, not kept, no error;
- for any other ask (it timed out and was asked again, the message was cancelled or restarted, or no step
  gave that token): refused, `StaleResponse`, noted.
An answer without a token is taken only where it cannot be meant for another wait: the message is
WAITING_FOR_RES and no answer was ever taken for it (its first question, or the same one asked again).
Anywhere else it could be an early answer to the next question or a repeat of an earlier answer, and it
is refused, `ResponseTokenNeeded`, noted. A final message without a token: `StateConflict`, as before.

This module is the one writer of the `waits` table and of `messages.response` (what ctx.response reads).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, and_, func, insert, select, update

from openhub.core.errors import ResponseTokenNeeded, StaleResponse, StateConflict
from openhub.core.states import FINAL, Note, State
from openhub.store.queries import record_transition, update_message
from openhub.store.schema import waits

W = waits.c


class Received(StrEnum):
    """What an answer turned out to be."""

    TAKEN = "taken"  # the open wait's answer: the caller resumes the route
    EARLY = "early"  # kept for the ask whose step still runs
    DUPLICATE = "duplicate"  # its wait was answered already: not kept
    STALE = "stale"  # no open wait has its token: refused (StaleResponse)
    TOKEN_NEEDED = "token_needed"  # no token, where it could answer the wrong wait: refused (ResponseTokenNeeded)

    def refusal(self, reason: str) -> StateConflict | None:
        """The error a refused answer is answered with (None: it was not refused)."""
        if self is Received.STALE:
            return StaleResponse(reason)
        if self is Received.TOKEN_NEEDED:
            return ResponseTokenNeeded(reason)
        return None


def receive(
    conn: Connection, row: Any, token: str | None, text: str, now: datetime, by: str | None = None
) -> tuple[Received, str]:
    """Bind an answer (JSON `text`) to the wait of message `row` (locked) that `token` names, writing what
    that takes: the answer kept for its ask, or a note in the history. Returns what it was, and a sentence
    saying so (the history's detail, or the refusal's message). TAKEN: the caller resumes the route.

    Raises StateConflict (nothing written) for an answer without a token to a final message.
    """
    about = _about(token, by)
    if token is None:
        if row.state == State.WAITING_FOR_RES and row.response is None:
            latest = _latest_ask(conn, row.id)  # None: a wait recorded before asks had tokens
            if latest is not None:
                _answer(conn, latest.id, text, by, now)
            update_message(conn, row.id, response=text)
            return Received.TAKEN, about
        if row.state in FINAL:
            raise StateConflict(f"message {row.id} is {row.state}, not waiting for a response")
        why = (
            "an earlier wait of it was answered"
            if row.response is not None and row.state == State.WAITING_FOR_RES
            else f"it is {row.state}, not waiting for a response"
        )
        reason = (
            f"message {row.id}: an answer without its wait's token is refused: {why}, so it could be a "
            "repeat of an earlier answer or an early answer to the next question; send it with the "
            "token its question gave (ctx.wait_token)"
        )
        _note(conn, row, Note.RESPONSE_REFUSED, f"{reason} ({about})", now)
        return Received.TOKEN_NEEDED, reason
    ask = conn.execute(select(waits).where(and_(W.token == token, W.message_id == row.id))).first()
    if ask is not None and ask.answer is not None:
        detail = f"answered again ({about}): already answered at {ask.answered_at:%Y-%m-%d %H:%M:%S}, not kept"
        _note(conn, row, Note.RESPONSE_DUPLICATE, detail, now)
        return Received.DUPLICATE, detail
    if (
        ask is not None
        and row.state == State.WAITING_FOR_RES
        and ask.asked_at is not None
        and ask.id == _latest_ask(conn, row.id).id
    ):
        _answer(conn, ask.id, text, by, now)
        update_message(conn, row.id, response=text)
        return Received.TAKEN, about
    if ask is None and row.state == State.PROCESSING and row.step_run == token:
        # Faster than the step that asks: kept for this ask alone; the step takes it when it records its wait.
        conn.execute(insert(waits).values(token=token, message_id=row.id, answer=text, answered_at=now, answered_by=by))
        _note(conn, row, Note.RESPONSE_EARLY, about, now)
        return Received.EARLY, about
    reason = (
        f"message {row.id} has no open wait with token {token}: that ask ended (it timed out and was asked "
        "again, or the message was cancelled, restarted or moved on) or never was; the answer is not taken"
    )
    _note(conn, row, Note.RESPONSE_REFUSED, f"{reason} ({about})", now)
    return Received.STALE, reason


def asked(conn: Connection, message_id: int, token: str, step_key: str, now: datetime) -> bool:
    """A step recorded its wait (`token`: its run's id, in the transaction that recorded it): its ask is
    written. True where its answer came while it ran: that answer is taken now (the route goes on)."""
    early = conn.execute(select(W.id, W.answer).where(W.token == token)).first()
    if early is None:
        conn.execute(insert(waits).values(token=token, message_id=message_id, step_key=step_key, asked_at=now))
        return False
    conn.execute(update(waits).where(W.id == early.id).values(step_key=step_key, asked_at=now))
    update_message(conn, message_id, response=early.answer)
    return True


def _latest_ask(conn: Connection, message_id: int) -> Any:
    """The message's last recorded ask (its open wait, while it is WAITING_FOR_RES). Asks are numbered in
    the order they were written: an ask's row is written while it runs or once it waits, after every
    earlier ask ended."""
    latest = select(func.max(W.id)).where(and_(W.message_id == message_id, W.asked_at.is_not(None))).scalar_subquery()
    return conn.execute(select(waits).where(W.id == latest)).first()


def _answer(conn: Connection, wait_id: int, text: str, by: str | None, now: datetime) -> None:
    conn.execute(update(waits).where(W.id == wait_id).values(answer=text, answered_at=now, answered_by=by))


def _about(token: str | None, by: str | None) -> str:
    """Who answered, and which wait (the history's detail)."""
    who = f"answered by {by}" if by else "answered"
    return f"{who}, wait {token}" if token else f"{who}, no token"


def _note(conn: Connection, row: Any, note: Note, detail: str, now: datetime) -> None:
    record_transition(conn, row.id, note.value, row.state, row.state, detail=detail, now=now)
