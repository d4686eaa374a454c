"""Reading messages back: one by id, a filtered page of them, or how many match (openhub/api/README.md:
HTTP, Python, command line)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from openhub.core.context import MessageView
from openhub.engine.hub import Hub, given
from openhub.store.queries import MessageFilter, message_view, message_views
from openhub.store.schema import messages


def get_message(message_id: int, *, hub: Hub | None = None) -> MessageView:
    """The message with its external calls; NotFound if there is none. `hub`: the hub whose store is read
    (default: the process's)."""
    with given(hub).transaction() as conn:
        return message_view(conn, int(message_id))


def count_messages(*, hub: Hub | None = None, **filters: Any) -> int:
    """How many messages match every filter of `list_messages`."""
    return count(MessageFilter(**filters), hub=hub)


def count(matching: MessageFilter, *, hub: Hub | None = None) -> int:
    """How many messages `matching` means (in `hub`'s store; default: the process's)."""
    with given(hub).transaction() as conn:
        found: int = conn.execute(matching.where(select(func.count()).select_from(messages))).scalar_one()
        return found


def list_messages(*, limit: int = 100, hub: Hub | None = None, **filters: Any) -> list[MessageView]:
    """Messages matching every given filter (the fields of `openhub.store.queries.MessageFilter`: state,
    service, operation, source_system, correlation_id, object_id, parent_id, error_code, process_id,
    received_from, received_to), newest first, at most `limit` (1-1000), in `hub`'s store (default: the
    process's)."""
    with given(hub).transaction() as conn:
        return message_views(conn, MessageFilter(**filters), max(1, min(int(limit), 1000)))
