"""/api/v1/messages, reading: search messages by filters, count them, show one in detail. A source system's
key sees only its own messages."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from openhub.api import ingress
from openhub.api.auth import Caller, reader
from openhub.api.detail import message_detail, source_view
from openhub.api.message_models import ERRORS, MAX_ID, MessageId, MessagePage, Timestamp, no_nul
from openhub.api.problems import NO_CONTROL, ApiError
from openhub.api.served import ServedHub
from openhub.api.summary import message_summaries
from openhub.core.states import State
from openhub.service import reads
from openhub.store.queries import MessageFilter

router = APIRouter(prefix="/api/v1", tags=["messages"])


def message_filters(
    caller: Annotated[Caller, Depends(reader)],
    state: State | None = None,
    service: Annotated[str | None, Query(max_length=100, json_schema_extra=NO_CONTROL)] = None,
    operation: Annotated[str | None, Query(max_length=100, json_schema_extra=NO_CONTROL)] = None,
    source_system: Annotated[str | None, Query(max_length=100, json_schema_extra=NO_CONTROL)] = None,
    # a split child's correlation id is longer than a source system's
    correlation_id: Annotated[str | None, Query(max_length=320, json_schema_extra=NO_CONTROL)] = None,
    object_id: Annotated[str | None, Query(max_length=255, json_schema_extra=NO_CONTROL)] = None,
    parent_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    error_code: Annotated[
        str | None, Query(max_length=100, description="The last failure's code.", json_schema_extra=NO_CONTROL)
    ] = None,
    process_id: Annotated[str | None, Query(max_length=255, json_schema_extra=NO_CONTROL)] = None,
    received_from: Timestamp | None = None,
    received_to: Timestamp | None = None,
) -> MessageFilter:
    """The search filters of a request; a source system's key sees only its own messages."""
    no_nul(
        service=service,
        operation=operation,
        source_system=source_system,
        correlation_id=correlation_id,
        object_id=object_id,
        error_code=error_code,
        process_id=process_id,
    )
    if not caller.admin:
        if source_system is not None and source_system != caller.source_system:
            raise ApiError(403, f"this API key may read only {caller.source_system}'s messages")
        source_system = caller.source_system
    return MessageFilter(
        state=state.value if state else None,
        service=service,
        operation=operation,
        source_system=source_system,
        correlation_id=correlation_id,
        object_id=object_id,
        parent_id=parent_id,
        error_code=error_code,
        process_id=process_id,
        received_from=ingress.utc(received_from, "received_from"),
        received_to=ingress.utc(received_to, "received_to"),
    )


Filters = Annotated[MessageFilter, Depends(message_filters)]


@router.get(
    "/messages",
    response_model=MessagePage,
    responses={s: ERRORS[s] for s in (400, 401, 403, 503)},
    summary="Search messages",
)
def search_messages(
    filters: Filters,
    hub: ServedHub,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=1, le=MAX_ID, description="`next_cursor` of the previous page.")] = None,
) -> dict[str, Any]:
    """Summaries (no payloads) of messages matching every filter, newest first; the detail has the payload.

    A source system's key sees only its own messages."""
    items = message_summaries(hub, filters, limit, cursor)
    return {"items": items, "next_cursor": items[-1]["id"] if len(items) == limit else None}


@router.get(
    "/messages:count",
    responses={s: ERRORS[s] for s in (400, 401, 403, 503)},
    summary="How many messages match the search filters",
)
def count_messages(filters: Filters, hub: ServedHub) -> dict[str, int]:
    """`{"total": n}` for the filters of `GET /api/v1/messages` (a source system's key: its own)."""
    return {"total": reads.count(filters, hub=hub)}


@router.get(
    "/messages/{message_id}",
    responses={s: ERRORS[s] for s in (400, 401, 404, 503)},
    summary="One message with ext calls, children, confirmation and history",
)
def get_message(
    request: Request, message_id: MessageId, caller: Annotated[Caller, Depends(reader)], hub: ServedHub
) -> dict[str, Any]:
    """The message with its external calls, children, confirmation rows and transition history; with a source
    system's key, without recorded exchanges, tracebacks, worker names or state hooks' rows."""
    request.state.message_id = message_id
    detail = message_detail(hub, message_id)
    if not caller.admin and detail["source_system"] != caller.source_system:
        raise ApiError(404, f"no message with id {message_id}")  # do not reveal other systems' ids
    request.state.correlation_id = detail["correlation_id"]
    return detail if caller.admin else source_view(detail)
