"""What a list of messages shows: one bounded summary per message, never its payload.

A page of up to 1000 messages with 1 MiB payloads would be a gigabyte in the ingress's memory
(and in the answer), so lists read only the columns below; the payload, custom data, business
errors and external calls are in the message's detail (`GET /api/v1/messages/{id}`). Every
field of a summary is bounded: ids are at most 255 characters, and the failure is reduced to
one line of the stored error (`context.error_line`), at most 500 characters.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from openhub.core.context import aware, error_line
from openhub.core.model import route_name
from openhub.engine.hub import Hub
from openhub.store.queries import MessageFilter
from openhub.store.schema import messages

M = messages.c
COLUMNS = (
    M.id,
    M.service,
    M.operation,
    M.state,
    M.source_system,
    M.correlation_id,
    M.process_id,
    M.object_id,
    M.entity_type,
    M.parent_id,
    M.failed_count,
    M.failed_step,
    M.failed_error,
    M.error_code,
    M.received_at,
    M.msg_timestamp,
    M.finished_at,
)


def _iso(value: datetime | None) -> str | None:
    value = aware(value)
    return value.isoformat() if value is not None else None


def message_summaries(
    hub: Hub, matching: MessageFilter, limit: int = 100, before_id: int | None = None
) -> list[dict[str, Any]]:
    """Summaries of the messages in `hub`'s store that `matching` means, newest first (`before_id`: the page
    after it)."""
    query = matching.where(select(*COLUMNS), before_id)
    query = query.order_by(M.id.desc()).limit(max(1, min(int(limit), 1000)))
    with hub.transaction() as conn:
        rows = conn.execute(query).all()
    return [
        {
            "id": r.id,
            "route": route_name(r.service, r.operation),
            "service": r.service,
            "operation": r.operation,
            "state": r.state,
            "source_system": r.source_system,
            "correlation_id": r.correlation_id,
            "process_id": r.process_id,
            "object_id": r.object_id,
            "entity_type": r.entity_type,
            "parent_id": r.parent_id,
            "failed_count": r.failed_count,
            "failed_step": r.failed_step,
            "failed_error": error_line(r.failed_error),
            "error_code": r.error_code,
            "received_at": _iso(r.received_at),
            "msg_timestamp": _iso(r.msg_timestamp),
            "finished_at": _iso(r.finished_at),
        }
        for r in rows
    ]
