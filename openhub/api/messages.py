"""/api/v1/messages, accepting: source systems submit one message or a batch.

Accepting is `openhub.submit` behind HTTP (grouped with concurrent submissions by
`batcher.AcceptBatcher`): the message is committed before the 202 leaves, a
repeated (source system, correlation id) answers 200 with the first message and
`"duplicate": true`, and a batch is one transaction (all or nothing). Reading messages back is
openhub.api.message_reads, operators' actions openhub.api.message_actions (their routers are listed before
this one in openhub.api.app.ROUTERS: the submission path's pattern would swallow the actions' old paths).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from openhub.api import body, ingress, metrics, sync
from openhub.api.auth import source_system
from openhub.api.message_actions import may_respond
from openhub.api.message_models import BATCH_BODY_FACTOR, ERRORS, PAYLOAD_BODY, Accepted, Batch, BatchAccepted
from openhub.api.problems import ApiError, refusals
from openhub.api.served import served
from openhub.core import tracing
from openhub.core.context import MessageView
from openhub.core.errors import InputError
from openhub.core.model import route_name
from openhub.core.topics import is_topic
from openhub.engine import fanout
from openhub.engine.hub import Hub
from openhub.service import messages as producer

__all__ = ["may_respond", "router"]  # may_respond: where it used to live

router = APIRouter(prefix="/api/v1", tags=["messages"])


def _accepted(view: MessageView) -> dict[str, Any]:
    return {
        "id": view.id,
        "correlation_id": view.correlation_id,
        "route": view.route,
        "state": view.state,
        "duplicate": view.duplicate,
    }


# Served after the old /messages/{id}/restart|cancel|response paths (openhub.api.app.ROUTERS), which its pattern
# would swallow (theirs take digits only, which no service name is).
@router.post(
    "/messages/{service}/{operation}",
    status_code=202,
    response_model=Accepted,
    openapi_extra=PAYLOAD_BODY,
    responses={
        200: {
            "description": "Duplicate: the first message with this correlation id; a "
            "synchronous route's message that ended OK in time, with its `result`",
            "model": Accepted,
        },
        **{s: e for s, e in ERRORS.items() if s != 409},
        **refusals(
            said={422: "A synchronous route's message ended FAILED or cancelled in time (its `error_code` and `error`)"}
        ),
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
    hub = served(request)
    data = await body.read_limited(request, hub.settings.max_payload_bytes)
    payload = await run_in_threadpool(body.decode_payload, data, mime, charset)
    view = await ingress.admit(
        request, system, route, payload, x_correlation_id, x_process_id, x_message_timestamp, x_expires_at, priority
    )
    if route.sync:
        seconds = sync.wait_seconds(prefer, hub.settings)
        row = await sync.ended(hub, view.id, seconds) if seconds > 0 else None
        if row is not None:
            content, status = sync.answer(_accepted(view), row)
            return JSONResponse(content, status_code=status)
        # not ended in time: 202 below (a duplicate still answers 200), the message goes on
    content = _accepted(view)
    if is_topic(route):  # a duplicate too: the receivers written with the first
        content["receivers"] = await run_in_threadpool(_receivers, hub, view.id)
    return JSONResponse(content, status_code=200 if view.duplicate else 202)


def _receivers(hub: Hub, family_id: int) -> list[dict[str, Any]]:
    with hub.transaction() as conn:
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
    hub = served(request)
    registry = hub.registry
    operations = sorted({r.operation for r in registry.routes.values()})
    if throttle.rules:  # refused before reading when nothing in the batch could be accepted now
        verdict = await run_in_threadpool(throttle.exhausted, system, operations)
        if not verdict.allowed:
            raise ApiError(
                429, f"{system} is over its throttling limits; retry later", {"Retry-After": str(verdict.retry_after)}
            )
    limit = hub.settings.max_payload_bytes * BATCH_BODY_FACTOR
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
        return producer.submit_many(items, hub=hub)

    views = await run_in_threadpool(accept)
    for view in views:
        if not view.duplicate:
            metrics.accepted(view.route, system)
    status = 200 if all(v.duplicate for v in views) else 202
    answers = [_accepted(v) for v in views]
    families = [a for a in answers if is_topic(registry.routes.get(a["route"]))]
    for answer in families:  # each topic's message with its receivers, as a single POST answers
        answer["receivers"] = await run_in_threadpool(_receivers, hub, answer["id"])
    return JSONResponse({"messages": answers}, status_code=status)
