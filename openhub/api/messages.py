"""/api/v1/messages: source systems submit messages; operators search, inspect, restart and cancel.

Accepting is `openhub.submit` behind HTTP (grouped with concurrent submissions by
`batcher.AcceptBatcher`): the message is committed before the 202 leaves, a
repeated (source system, correlation id) answers 200 with the first message and
`"duplicate": true`, and a batch is one transaction (all or nothing).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from openhub.api import body, ingress, metrics, sync
from openhub.api.auth import Caller, reader, source_system
from openhub.api.auth import operator as can_operate
from openhub.api.detail import message_detail, source_view
from openhub.api.problems import NO_CONTROL, ApiError
from openhub.api.served import ServedHub, served
from openhub.api.summary import message_summaries
from openhub.core import tracing
from openhub.core.context import MessageView
from openhub.core.errors import InputError
from openhub.core.model import Route, route_name
from openhub.core.registry import get_registry
from openhub.core.states import State
from openhub.core.topics import is_topic
from openhub.engine import fanout
from openhub.service import actions as operator
from openhub.service import messages as producer
from openhub.service import reads
from openhub.store.db import transaction
from openhub.store.queries import MessageFilter

MAX_ID = 2**63 - 1
BATCH_MAX_MESSAGES = 1000
BATCH_BODY_FACTOR = 10  # a batch body may be this many times OPENHUB_MAX_PAYLOAD_BYTES

Operating = Annotated[Caller, Depends(can_operate)]
MessageId = Annotated[int, Path(ge=1, le=MAX_ID, description="The message's id.")]


def _not_a_number(value: Any) -> Any:
    # pydantic reads a number (or text that is one) as seconds since 1970: `received_to=0.5` would
    # search up to 1970-01-01T00:00:00.5 instead of being refused as the mistake it is.
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, (int, float)) or text:
        try:
            float(value if text is None else text)
        except ValueError:
            return value
        raise ValueError("must be an ISO 8601 timestamp, not a number")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_not_a_number)]
"""A datetime given as ISO 8601 text (or a datetime); a number is refused, never read as epoch seconds."""
# Fields below are strict where pydantic's lax mode would turn a wrong type into a value:
# `{"total": 0}` a bool, `{"limit": "5"}` or `{"limit": 5.0}` an int.


class Accepted(BaseModel):
    """The answer to a submission: the stored message's id and state."""

    id: int
    correlation_id: str
    route: str
    state: str
    duplicate: bool = Field(
        description="True when (source system, correlation id) was already stored; "
        "nothing new was stored and this is the first message."
    )


class BatchItem(BaseModel):
    """One message of a batch: the route (or service and operation), payload and correlation id."""

    model_config = ConfigDict(extra="forbid")
    route: str | None = Field(
        None, description="`service.operation`; or give `service` and `operation`.", examples=["customer.setCustomer"]
    )
    service: str | None = None
    operation: str | None = None
    payload: Any = Field(..., description="The message payload (any JSON value).")
    correlation_id: str = Field(..., min_length=1, max_length=255)
    process_id: str | None = Field(None, max_length=255)
    msg_timestamp: str | None = Field(None, description="ISO 8601; orders versions of one entity.")
    expires_at: str | None = Field(None, description="ISO 8601; not started by then, it ends FAILED (EXPIRED).")
    source_system: str | None = Field(None, description="If given, must be the API key's own source system.")
    priority: int | None = Field(None, description="0-9, higher = sooner; none: the route's default.")


class Batch(BaseModel):
    """A batch of messages accepted all-or-nothing in one transaction."""

    model_config = ConfigDict(extra="forbid")
    messages: list[BatchItem] = Field(..., min_length=1, max_length=BATCH_MAX_MESSAGES)


def extra_schemas() -> dict[str, Any]:
    """Component schemas of request bodies the endpoints read themselves (to enforce the size limit first)."""
    schema = Batch.model_json_schema(ref_template="#/components/schemas/{model}")
    found = dict(schema.pop("$defs", {}))
    found["Batch"] = schema
    return found


class BatchAccepted(BaseModel):
    """The answer to a batch, in the order of the request."""

    messages: list[Accepted]


class RestartRequest(BaseModel):
    """Options of a restart."""

    model_config = ConfigDict(extra="forbid")
    total: bool = Field(False, strict=True, description="Also forget OK external calls, so every call is made again.")
    from_step: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        json_schema_extra=NO_CONTROL,
        description="Restart from this step of the route: its and the later steps' "
        "call records are cleared, the earlier steps are not called again.",
    )


class Resubmission(BaseModel):
    """The corrected payload of a FAILED message."""

    model_config = ConfigDict(extra="forbid")
    payload: Any = Field(..., description="The new payload (any JSON value), checked as a submission's is.")


class Matching(BaseModel):
    """The messages a bulk action acts on: those matching every given filter (at least one), oldest first."""

    model_config = ConfigDict(extra="forbid")
    state: State | None = None
    route: str | None = Field(None, max_length=201, description="`service.operation`.")
    service: str | None = Field(None, max_length=100)
    operation: str | None = Field(None, max_length=100)
    source_system: str | None = Field(None, max_length=100)
    correlation_id: str | None = Field(None, max_length=320)
    error_code: str | None = Field(None, max_length=100)
    process_id: str | None = Field(None, max_length=255)
    object_id: str | None = Field(None, max_length=255)
    parent_id: int | None = Field(None, strict=True, ge=1, le=MAX_ID)
    received_from: Timestamp | None = None
    received_to: Timestamp | None = None
    limit: int = Field(operator.BULK_LIMIT, strict=True, ge=1, le=operator.BULK_LIMIT)

    def filters(self) -> dict[str, Any]:
        _no_nul(
            route=self.route,
            service=self.service,
            operation=self.operation,
            source_system=self.source_system,
            correlation_id=self.correlation_id,
            error_code=self.error_code,
            process_id=self.process_id,
            object_id=self.object_id,
        )
        service, operation = self.service, self.operation
        if self.route is not None:
            if service is not None or operation is not None:
                raise InputError("give either route or service and operation")
            service, operation = get_registry().route(self.route).name.split(".", 1)
        return dict(
            state=self.state.value if self.state else None,
            service=service,
            operation=operation,
            source_system=self.source_system,
            correlation_id=self.correlation_id,
            error_code=self.error_code,
            process_id=self.process_id,
            object_id=self.object_id,
            parent_id=self.parent_id,
            limit=self.limit,
            received_from=ingress.utc(self.received_from, "received_from"),
            received_to=ingress.utc(self.received_to, "received_to"),
        )


class RestartMatching(Matching):
    """A bulk restart: the filters, and whether every external call is made again."""

    total: bool = Field(False, strict=True, description="Also forget OK external calls, so every call is made again.")


class BulkDone(BaseModel):
    """What a bulk action did."""

    done: list[int] = Field(description="The messages acted on, oldest first.")
    refused: list[dict[str, Any]] = Field(description="`{id, reason}` of matching messages that had moved on.")
    more: bool = Field(description="More messages match than `limit`: run the action again for them.")


class MessageSummary(BaseModel):
    """A message as a list shows it: no payload, every field bounded (the detail has the rest)."""

    id: int
    route: str
    service: str
    operation: str
    state: str
    source_system: str
    correlation_id: str
    process_id: str | None
    object_id: str | None
    entity_type: str | None
    parent_id: int | None
    failed_count: int
    failed_step: str | None
    failed_error: str | None = Field(description="One line of the error (a traceback: its exception), bounded.")
    error_code: str | None = Field(default=None, description="The last failure's searchable code.")
    received_at: str
    msg_timestamp: str | None
    finished_at: str | None


class MessagePage(BaseModel):
    """One page of message summaries, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[MessageSummary]
    next_cursor: int | None


ERRORS = {
    s: {"description": d}
    for s, d in {
        400: "Malformed request, bad payload or payload refused by the route's validation",
        401: "Missing or invalid API key",
        403: "The key may not do this",
        404: "Unknown route or message",
        409: "The message's state does not allow this",
        413: "Body over OPENHUB_MAX_PAYLOAD_BYTES",
        415: "Unsupported media type",
        429: "Throttled; see Retry-After",
        503: "Message store unavailable; nothing stored",
    }.items()
}

_PAYLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The payload: JSON, or text/XML stored as a JSON string.",
        "content": {
            "application/json": {"schema": {}},
            "text/plain": {"schema": {"type": "string"}},
            "application/xml": {"schema": {"type": "string"}},
        },
    }
}

router = APIRouter(prefix="/api/v1", tags=["messages"])


def _accepted(view: MessageView) -> dict[str, Any]:
    return {
        "id": view.id,
        "correlation_id": view.correlation_id,
        "route": view.route,
        "state": view.state,
        "duplicate": view.duplicate,
    }


def _no_nul(**values: str | None) -> None:
    for name, value in values.items():
        if value is not None and "\x00" in value:
            raise ApiError(400, f"{name} must not contain NUL characters")


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
    _no_nul(
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
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=1, le=MAX_ID, description="`next_cursor` of the previous page.")] = None,
) -> dict[str, Any]:
    """Summaries (no payloads) of messages matching every filter, newest first; the detail has the payload.

    A source system's key sees only its own messages."""
    items = message_summaries(filters, limit, cursor)
    return {"items": items, "next_cursor": items[-1]["id"] if len(items) == limit else None}


@router.get(
    "/messages:count",
    responses={s: ERRORS[s] for s in (400, 401, 403, 503)},
    summary="How many messages match the search filters",
)
def count_messages(filters: Filters) -> dict[str, int]:
    """`{"total": n}` for the filters of `GET /api/v1/messages` (a source system's key: its own)."""
    return {"total": reads.count(filters)}


@router.get(
    "/messages/{message_id}",
    responses={s: ERRORS[s] for s in (400, 401, 404, 503)},
    summary="One message with ext calls, children, confirmation and history",
)
def get_message(request: Request, message_id: MessageId, caller: Annotated[Caller, Depends(reader)]) -> dict[str, Any]:
    """The message with its external calls, children, confirmation rows and transition history; with a source
    system's key, without recorded exchanges, tracebacks, worker names or state hooks' rows."""
    request.state.message_id = message_id
    detail = message_detail(message_id)
    if not caller.admin and detail["source_system"] != caller.source_system:
        raise ApiError(404, f"no message with id {message_id}")  # do not reveal other systems' ids
    request.state.correlation_id = detail["correlation_id"]
    return detail if caller.admin else source_view(detail)


def _superseded(action: str) -> Any:
    """A dependency of an operator action's old path: the answer names the path that replaces it."""

    def successor(request: Request, response: Response) -> None:
        response.headers["Link"] = (
            f'</api/v1/messages/{request.path_params["message_id"]}:{action}>; rel="successor-version"'
        )

    return Depends(successor)


def _old_path(action: str) -> dict[str, Any]:
    """The options of an operator action's path before issue 40, `/messages/{id}/<action>`: kept working one
    release, for numeric ids only, so that it can never take a route's submission (`order.cancel` is
    `/messages/order/cancel`; a service name starts with a letter)."""
    return dict(
        path=f"/messages/{{message_id:int}}/{action}",
        deprecated=True,
        dependencies=[_superseded(action)],
        operation_id=f"{action}_message_old_path",
        summary=f"Old path of POST /messages/{{id}}:{action}",
    )


# The operator's actions on one message are `/messages/{id}:<action>` (as the bulk ones are `/messages:<action>`):
# one path segment where a route's submission has two, so no route name can ever reach them.
@router.post(
    "/messages/{message_id}:restart",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)},
    summary="Restart a final message",
)
@router.post(**_old_path("restart"), responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)})
def restart_message(
    request: Request, message_id: MessageId, _: Operating, hub: ServedHub, options: RestartRequest | None = None
) -> dict[str, Any]:
    """Restart an OK, FAILED or CANCEL message (`total`: make every external call again)."""
    request.state.message_id = message_id
    if options is not None and options.from_step is not None:
        if options.total:
            raise ApiError(400, "give either total or from_step")
        return operator.restart_from(message_id, options.from_step, hub=hub).as_dict()
    return operator.restart(message_id, total=bool(options and options.total), hub=hub).as_dict()


@router.post(
    "/messages/{message_id}:retry",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)},
    summary="Retry a PARTLY_FAILED or POSTPONED message now",
)
def retry_message(request: Request, message_id: MessageId, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """The message is due at once instead of after its back-off; its failure count is left as it is."""
    request.state.message_id = message_id
    return operator.retry_now(message_id, hub=hub).as_dict()


@router.post(
    "/messages/{message_id}:resubmit",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 413, 503)},
    summary="Replace a FAILED message's payload and restart it",
)
def resubmit_message(
    request: Request, message_id: MessageId, _: Operating, hub: ServedHub, resubmission: Resubmission
) -> dict[str, Any]:
    """The new payload is checked as a submission's is; the old one is kept in the history; the message is
    restarted from the step that failed."""
    request.state.message_id = message_id
    return operator.edit_payload(message_id, resubmission.payload, hub=hub).as_dict()


@router.post(
    "/messages/{message_id}:cancel",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)},
    summary="Cancel a message that is not final yet",
)
@router.post(**_old_path("cancel"), responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)})
def cancel_message(request: Request, message_id: MessageId, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """Cancel a non-final message; it is confirmed as CANCEL."""
    request.state.message_id = message_id
    return operator.cancel(message_id, hub=hub).as_dict()


_BULK_ERRORS = {s: ERRORS[s] for s in (400, 401, 403, 404, 503)}


@router.post(
    "/messages:restart",
    response_model=BulkDone,
    responses=_BULK_ERRORS,
    summary="Restart the final messages matching filters",
)
def restart_matching(matching: RestartMatching, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """Restart every OK, FAILED or CANCEL message matching the filters (up to `limit`, oldest first)."""
    return operator.restart_matching(total=matching.total, hub=hub, **matching.filters()).as_dict()


@router.post(
    "/messages:cancel",
    response_model=BulkDone,
    responses=_BULK_ERRORS,
    summary="Cancel the live messages matching filters",
)
def cancel_matching(matching: Matching, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """Cancel every message not final yet matching the filters (up to `limit`, oldest first)."""
    return operator.cancel_matching(hub=hub, **matching.filters()).as_dict()


@router.post(
    "/messages/{message_id}:response",
    openapi_extra=_PAYLOAD_BODY,
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 413, 415, 503)},
    summary="Deliver the response a WAITING_FOR_RES message waits for",
)
@router.post(
    **_old_path("response"),
    openapi_extra=_PAYLOAD_BODY,
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 413, 415, 503)},
)
async def respond_message(
    request: Request,
    message_id: MessageId,
    caller: Annotated[Caller, Depends(reader)],
    token: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            json_schema_extra=NO_CONTROL,
            description="The wait this answers: the `ctx.wait_token` of the step that asked "
            "(`ctx.response_url(...)` carries it).",
        ),
    ] = None,
) -> dict[str, Any]:
    """Resume a message parked by `ctx.wait_for_response`: the admin token, the route's `responders`, or where it
    names none the message's own source system.

    With `token`, the answer is taken for that wait only (also while its question is still being asked); the
    same token again answers 200 with `"duplicate": true` and is not kept; a token of a wait that has ended
    answers 409. Without one, the answer is taken only while the message waits and none was ever taken for
    it (otherwise 409: a token is needed)."""
    request.state.message_id = message_id
    mime, charset = body.media_type(request)
    data = await body.read_limited(request, served(request).settings.max_payload_bytes)
    payload = await run_in_threadpool(body.decode_payload, data, mime, charset)

    if caller.admin and not caller.may("operator"):
        raise ApiError(
            403, f"answering for a message needs the role operator; the token {caller.name!r} is a {caller.role}"
        )

    hub = served(request)

    def deliver() -> dict[str, Any]:
        message = reads.get_message(message_id, hub=hub)
        route = hub.registry.route(message.route)
        refused = may_respond(route, message.source_system, caller)
        if refused == 404:
            raise ApiError(404, f"no message with id {message_id}")  # do not reveal other systems' ids
        if refused == 403:
            whom = ", ".join(route.responders)
            raise ApiError(
                403, f"{caller.source_system} may not answer {route.name}'s callbacks; its responders are {whom}"
            )
        by = caller.source_system or caller.name or "admin"
        return operator.respond(message_id, payload, token=token, by=by, hub=hub).as_dict()

    return await run_in_threadpool(deliver)


def may_respond(route: Route, owner: str, caller: Caller) -> int | None:
    """Whether `caller` may answer a message of `route` submitted by `owner`: None if so, else the
    status to refuse with (404 where the caller may not even see the message, 403 where it may).

    The admin token always may. A route that names its `responders=` (the third party that answers,
    e.g. a bank) takes an answer from those only, so the system that asked cannot answer its own
    third-party callback (issue 27); a route that names none takes it from the message's own source
    system, as before responders could be named.
    """
    if caller.admin or caller.source_system in route.responders:
        return None
    if not route.responders and caller.source_system == owner:
        return None
    return 403 if caller.source_system == owner else 404


# Registered after the old /messages/{id}/restart|cancel|response paths, which its pattern would swallow (theirs
# take digits only, which no service name is).
@router.post(
    "/messages/{service}/{operation}",
    status_code=202,
    response_model=Accepted,
    openapi_extra=_PAYLOAD_BODY,
    responses={
        200: {
            "description": "Duplicate: the first message with this correlation id; a "
            "synchronous route's message that ended OK in time, with its `result`",
            "model": Accepted,
        },
        **{s: e for s, e in ERRORS.items() if s != 409},
        422: {
            "description": "A synchronous route's message ended FAILED or cancelled in time "
            "(its `error_code` and `error`)"
        },
    },
    summary="Submit a message",
)
async def submit_message(
    request: Request,
    service: Annotated[str, Path(max_length=100)],
    operation: Annotated[str, Path(max_length=100)],
    system: Annotated[str, Depends(source_system)],
    x_correlation_id: Annotated[
        str, Header(min_length=1, max_length=255, description="Unique per source system; a repeat is a duplicate.")
    ],
    x_process_id: Annotated[str | None, Header(max_length=255)] = None,
    x_message_timestamp: Annotated[str | None, Header(description="ISO 8601 timestamp of the message.")] = None,
    x_source_system: Annotated[str | None, Header(description="Optional; must match the API key.")] = None,
    x_expires_at: Annotated[
        str | None,
        Header(description="ISO 8601; not started by then, the message ends FAILED with error code EXPIRED."),
    ] = None,
    prefer: Annotated[
        str | None,
        Header(
            max_length=200,
            description=(
                "A synchronous route's wait: `wait=N` seconds (capped by OPENHUB_SYNC_MAX_WAIT), "
                "`respond-async` for none."
            ),
        ),
    ] = None,
    x_priority: Annotated[
        str | None, Header(description="0-9, higher = sooner (JMSPriority); none: the route's default.")
    ] = None,
) -> JSONResponse:
    """Accept one message for route `service.operation`; it is stored before the answer leaves."""
    x_correlation_id = ingress.utf8(x_correlation_id, "X-Correlation-Id")
    x_process_id = None if x_process_id is None else ingress.utf8(x_process_id, "X-Process-Id")
    request.state.correlation_id = x_correlation_id
    if x_source_system is not None and x_source_system != system:
        raise ApiError(403, f"this API key belongs to {system}, not {x_source_system}")
    route = ingress.submitted_route(request, route_name(service, operation))
    mime, charset = body.media_type(request)
    if not (body.is_json(mime) or body.is_text(mime)):
        raise ApiError(415, f"unsupported media type {mime!r}: use application/json, text/plain or application/xml")
    priority = ingress.priority(request, route, x_priority, "X-Priority")
    # Throttled before the body is read: a refused caller costs no reading or parsing.
    await ingress.check(request, system, route, x_message_timestamp, x_expires_at)
    data = await body.read_limited(request, served(request).settings.max_payload_bytes)
    payload = await run_in_threadpool(body.decode_payload, data, mime, charset)
    view = await ingress.admit(
        request, system, route, payload, x_correlation_id, x_process_id, x_message_timestamp, x_expires_at, priority
    )
    if route.sync:
        seconds = sync.wait_seconds(prefer, served(request).settings)
        row = await sync.ended(view.id, seconds) if seconds > 0 else None
        if row is not None:
            content, status = sync.answer(_accepted(view), row)
            return JSONResponse(content, status_code=status)
        # not ended in time: 202 below (a duplicate still answers 200), the message goes on
    content = _accepted(view)
    if is_topic(route):  # a duplicate too: the receivers written with the first
        content["receivers"] = await run_in_threadpool(_receivers, view.id)
    return JSONResponse(content, status_code=200 if view.duplicate else 202)


def _receivers(family_id: int) -> list[dict[str, Any]]:
    with transaction() as conn:
        return fanout.receivers_of(conn, family_id)


# A route written as users name it (`customer.setCustomer`) lands here, where the path has one segment
# too few: the answer shows the URL meant, instead of the bare 405 of GET /messages/{id}'s path.
@router.post("/messages/{name}", include_in_schema=False)
def misaddressed_submit(name: Annotated[str, Path(max_length=201)]) -> None:
    """Refuse a POST to `/messages/{name}` with the URL that was probably meant."""
    service, dot, operation = name.partition(".")
    if dot and service and operation:
        raise ApiError(
            404,
            f"no endpoint POST /api/v1/messages/{name}: a route is addressed as "
            f"/{{service}}/{{operation}}, here POST /api/v1/messages/{service}/{operation}",
        )
    raise ApiError(
        404,
        f"no endpoint POST /api/v1/messages/{name}: submit with POST /api/v1/messages/"
        "{service}/{operation}; act on a message with POST /api/v1/messages/{id}:restart, "
        ":cancel, :retry, :resubmit or :response",
    )


def _parse_batch(data: bytes, charset: str) -> Batch:
    try:
        return Batch.model_validate(body.decode_json(data, charset))
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ApiError(400, detail) from None


@router.post(
    "/messages:batch",
    status_code=202,
    response_model=BatchAccepted,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Batch"}}},
        }
    },
    responses={
        200: {"description": "Every message was a duplicate", "model": BatchAccepted},
        **{s: e for s, e in ERRORS.items() if s != 409},
    },
    summary="Submit several messages, all or nothing",
)
async def submit_batch(request: Request, system: Annotated[str, Depends(source_system)]) -> JSONResponse:
    """Accept a batch in one transaction: one bad message and none is stored (the error names it)."""
    mime, charset = body.media_type(request)
    if not body.is_json(mime):
        raise ApiError(415, "a batch is application/json")
    throttle = request.app.state.throttle
    registry = served(request).registry
    operations = sorted({r.operation for r in registry.routes.values()})
    if throttle.rules:  # refused before reading when nothing in the batch could be accepted now
        verdict = await run_in_threadpool(throttle.exhausted, system, operations)
        if not verdict.allowed:
            raise ApiError(
                429, f"{system} is over its throttling limits; retry later", {"Retry-After": str(verdict.retry_after)}
            )
    limit = served(request).settings.max_payload_bytes * BATCH_BODY_FACTOR
    data = await body.read_limited(request, limit)
    batch = await run_in_threadpool(_parse_batch, data, charset)
    items = []
    counts: dict[str, int] = {}
    traceparent = tracing.current_traceparent()  # every message of the batch joins the request's trace
    for i, item in enumerate(batch.messages):
        if item.source_system is not None and item.source_system != system:
            raise ApiError(403, f"message #{i}: this API key belongs to {system}, not {item.source_system}")
        if item.route is not None and (item.service or item.operation):
            if item.route != route_name(item.service, item.operation):
                raise InputError(f"message #{i}: give either route or service and operation")
        name = item.route or (route_name(item.service, item.operation) if item.service and item.operation else None)
        if name is None:
            raise InputError(f"message #{i}: route (or service and operation) is required")
        route = ingress.submitted_route(request, name, f"message #{i}: ")
        ingress.utc(item.msg_timestamp, f"message #{i}: msg_timestamp")
        ingress.utc(item.expires_at, f"message #{i}: expires_at")
        priority = ingress.priority(request, route, item.priority, f"message #{i}: priority")
        counts[route.operation] = counts.get(route.operation, 0) + 1
        items.append(
            dict(
                route=route.name,
                payload=item.payload,
                source_system=system,
                correlation_id=item.correlation_id,
                process_id=item.process_id,
                msg_timestamp=item.msg_timestamp,
                expires_at=item.expires_at,
                traceparent=traceparent,
                priority=priority,
            )
        )

    def accept() -> list[MessageView]:
        ingress.throttled(request, system, counts)
        return producer.submit_many(items)

    views = await run_in_threadpool(accept)
    for view in views:
        if not view.duplicate:
            metrics.accepted(view.route, system)
    status = 200 if all(v.duplicate for v in views) else 202
    answers = [_accepted(v) for v in views]
    families = [a for a in answers if is_topic(registry.routes.get(a["route"]))]
    for answer in families:  # each topic's message with its receivers, as a single POST answers
        answer["receivers"] = await run_in_threadpool(_receivers, answer["id"])
    return JSONResponse({"messages": answers}, status_code=status)
