"""Recorded HTTP exchanges: writing one, reading a message's, and pruning old ones.

An exchange is written by `openhub.outbound.http` in its own short transaction right after the response
(or the failure) arrived, so the engine needs no change and the record survives a later crash
of the step. Secrets never reach the store: URLs, error texts, headers and bodies are redacted
(`openhub.core.redact`, as OPENHUB_REDACT_HEADERS and OPENHUB_REDACT_BODIES say) at the one place that
writes them, bodies before they are cut so a cut JSON body is still parsed whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from openhub.core.config import Settings
from openhub.core.context import aware
from openhub.core.redact import redact_body, redact_headers, redact_text, redact_url
from openhub.store.db import store_now, transaction
from openhub.store.schema import http_exchanges


@dataclass(frozen=True)
class Exchange:
    """One request and its response (or the error instead of one), as a step made it."""

    message_id: int
    step_key: str
    attempt: int
    method: str
    url: str
    status: int | None
    error: str | None
    request_headers: Mapping[str, str]
    request_body: bytes | None
    response_headers: Mapping[str, str]
    response_body: bytes | None
    duration_ms: int
    at: datetime


def truncate_body(body: bytes | None, limit: int) -> str | None:
    """A body as text, cut to `limit` bytes with a note of how much was left out."""
    if body is None:
        return None
    text = body[:limit].decode("utf-8", errors="replace")
    if len(body) > limit:
        text += f"… [{len(body) - limit} more bytes not recorded]"
    return text


def record_exchange(exchange: Exchange, settings: Settings) -> None:
    """Write one exchange in its own transaction on the store of `settings` (the hub's that made it): bodies
    redacted as they say (OPENHUB_REDACT_HEADERS, OPENHUB_REDACT_BODIES), then cut to OPENHUB_HTTP_RECORD_BYTES."""
    limit, names, mode = settings.http_record_bytes, settings.redact_headers, settings.redact_bodies
    row = {
        "message_id": exchange.message_id,
        "step_key": exchange.step_key[:100],
        "attempt": exchange.attempt,
        "method": exchange.method[:10],
        "url": redact_url(exchange.url),
        "status": exchange.status,
        "error": redact_text(exchange.error),
        "request_headers": json.dumps(redact_headers(exchange.request_headers.items(), names)),
        "request_body": truncate_body(
            redact_body(exchange.request_body, _content_type(exchange.request_headers), mode), limit
        ),
        "response_headers": json.dumps(redact_headers(exchange.response_headers.items(), names)),
        "response_body": truncate_body(
            redact_body(exchange.response_body, _content_type(exchange.response_headers), mode), limit
        ),
        "duration_ms": exchange.duration_ms,
        "at": exchange.at,
    }
    with transaction(settings.database_url) as conn:
        conn.execute(insert(http_exchanges).values(**row))


def _content_type(headers: Mapping[str, str]) -> str | None:
    return next((value for name, value in headers.items() if name.lower() == "content-type"), None)


def message_exchanges(conn: Connection, message_id: int) -> list[dict[str, Any]]:
    """A message's recorded exchanges, oldest first, as JSON-ready dicts."""
    H = http_exchanges.c
    out = []
    for r in conn.execute(select(http_exchanges).where(H.message_id == message_id).order_by(H.id)):
        at = aware(r.at)
        out.append(
            {
                "id": r.id,
                "step": r.step_key,
                "attempt": r.attempt,
                "method": r.method,
                "url": r.url,
                "status": r.status,
                "error": r.error,
                "duration_ms": r.duration_ms,
                "at": at.isoformat() if at else None,
                "request_headers": json.loads(r.request_headers or "{}"),
                "request_body": r.request_body,
                "response_headers": json.loads(r.response_headers or "{}"),
                "response_body": r.response_body,
            }
        )
    return out


def prune_exchanges(settings: Settings, now: datetime | None = None, days: int | None = None) -> int:
    """Delete the exchanges in the store of `settings` older than `days` (default: their
    OPENHUB_HTTP_RECORD_DAYS); returns how many went."""
    days = settings.http_record_days if days is None else days
    cutoff = (now or store_now(settings.database_url)) - timedelta(days=days)
    with transaction(settings.database_url) as conn:
        return conn.execute(delete(http_exchanges).where(http_exchanges.c.at < cutoff)).rowcount or 0
