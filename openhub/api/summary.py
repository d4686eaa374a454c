"""What a list of messages shows: one bounded summary per message, never its payload.

A page of up to 1000 messages with 1 MiB payloads would be a gigabyte in the ingress's memory
(and in the answer), so lists read only the columns below; the payload, custom data, business
errors and external calls are in the message's detail (`GET /api/v1/messages/{id}`). Every
field of a summary is bounded: ids are at most 255 characters, and the failure is reduced to
the last line of the stored error, at most `ERROR_CHARS` characters.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from ..context import aware
from ..db import transaction
from ..errors import InputError
from ..producer import search_text
from ..schema import messages
from ..states import State

M = messages.c
ERROR_CHARS = 500
COLUMNS = (M.id, M.service, M.operation, M.state, M.source_system, M.correlation_id, M.process_id, M.object_id,
           M.entity_type, M.parent_id, M.failed_count, M.failed_step, M.failed_error, M.error_code, M.received_at,
           M.msg_timestamp, M.finished_at)


def last_line(error: str | None) -> str | None:
    """The last non-empty line of a stored error (a traceback ends with the exception), bounded."""
    if not error:
        return error
    lines = [line for line in error.strip().splitlines() if line.strip()]
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 1] + "…"


def _iso(value: datetime | None) -> str | None:
    value = aware(value)
    return value.isoformat() if value is not None else None


def message_summaries(*, state: str | None = None, service: str | None = None, operation: str | None = None,
                      source_system: str | None = None, correlation_id: str | None = None,
                      object_id: str | None = None, parent_id: int | None = None, error_code: str | None = None,
                      received_from: datetime | None = None, received_to: datetime | None = None,
                      before_id: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Summaries of the messages matching every filter, newest first (`before_id` pages on)."""
    if state is not None and state not in State.__members__:
        raise InputError(f"unknown state {state!r}")
    for value, name in ((service, "service"), (operation, "operation"), (source_system, "source_system"),
                        (correlation_id, "correlation_id"), (object_id, "object_id"), (error_code, "error_code")):
        search_text(value, name)
    query = select(*COLUMNS)
    for column, value in ((M.state, state), (M.service, service), (M.operation, operation),
                          (M.source_system, source_system), (M.correlation_id, correlation_id),
                          (M.object_id, object_id), (M.parent_id, parent_id), (M.error_code, error_code)):
        if value is not None:
            query = query.where(column == value)
    if received_from is not None:
        query = query.where(M.received_at >= received_from)
    if received_to is not None:
        query = query.where(M.received_at < received_to)
    if before_id is not None:
        query = query.where(M.id < before_id)
    query = query.order_by(M.id.desc()).limit(max(1, min(int(limit), 1000)))
    with transaction() as conn:
        rows = conn.execute(query).all()
    return [{"id": r.id, "route": f"{r.service}.{r.operation}", "service": r.service, "operation": r.operation,
             "state": r.state, "source_system": r.source_system, "correlation_id": r.correlation_id,
             "process_id": r.process_id, "object_id": r.object_id, "entity_type": r.entity_type,
             "parent_id": r.parent_id, "failed_count": r.failed_count, "failed_step": r.failed_step,
             "failed_error": last_line(r.failed_error), "error_code": r.error_code, "received_at": _iso(r.received_at),
             "msg_timestamp": _iso(r.msg_timestamp), "finished_at": _iso(r.finished_at)} for r in rows]
