"""Admitting one message, whichever ingress it came through (the JSON API's POST, the SOAP endpoint):
the route it is for, its timestamps, throttling, storing (with its duplicate check, the route's `sources=`
and its validation, in openhub.service.messages and openhub.engine.intake) and counting. Both ingresses
call these; neither has its own copy.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from openhub.api import metrics
from openhub.api.problems import ApiError
from openhub.api.served import served
from openhub.core import tracing
from openhub.core.context import MessageView
from openhub.core.errors import InputError, UnknownRouteError
from openhub.core.model import Route
from openhub.engine import intake


def utc(value: datetime | str | None, what: str) -> datetime | None:
    """`intake.to_utc`, with a timestamp that leaves datetime's range (year 1 or 9999 plus an offset) a 400."""
    try:
        return intake.to_utc(value, what)
    except OverflowError:
        raise ApiError(400, f"{what} is out of range") from None


def utf8(value: str, name: str) -> str:
    """An id header's text: HTTP carries its bytes, which Starlette reads as Latin-1, and clients send
    UTF-8 (`bestellung-ü-1` was stored as `bestellung-Ã¼-1`). Bytes that are not UTF-8 are a 400."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ApiError(400, f"{name} is not UTF-8 text") from None


def throttled(request: Request, system: str, counts: dict[str, int]) -> None:
    """429 (with Retry-After) when `system` is over a throttling limit of an operation of `counts`."""
    throttle = request.app.state.throttle
    for operation, hits in counts.items():
        verdict = throttle.check(system, operation, hits)
        if not verdict.allowed:
            raise ApiError(
                429,
                f"{system}.{operation} is over its throttling limit; retry later",
                {"Retry-After": str(verdict.retry_after)},
            )


def submitted_route(request: Request, name: str, which: str = "") -> Route:
    """The route a source system submits to; unknown, a 404 naming it alone: the hub's route table is the
    operators' (GET /api/v1/routes), not to be listed to every key that misspells one."""
    try:
        return served(request).registry.route(name)
    except UnknownRouteError:
        raise ApiError(404, f"{which}unknown route {name!r}") from None


def priority(request: Request, route: Route, value: Any, what: str) -> int:
    """The message's priority (`intake.message_priority`), a bad one a 400 naming where it was given."""
    try:
        return intake.message_priority(route, value, served(request).settings)
    except InputError as exc:
        raise ApiError(400, f"{what}: {exc}") from None


async def check(
    request: Request,
    system: str,
    route: Route,
    msg_timestamp: str | None = None,
    expires_at: str | None = None,
    timestamp_names: tuple[str, str] = ("X-Message-Timestamp", "X-Expires-At"),
) -> None:
    """What is refused before a message's payload is looked at: bad timestamps (400), throttling (429)."""
    utc(msg_timestamp, timestamp_names[0])
    utc(expires_at, timestamp_names[1])
    if request.app.state.throttle.applies(system, route.operation):
        await run_in_threadpool(throttled, request, system, {route.operation: 1})


async def admit(
    request: Request,
    system: str,
    route: Route,
    payload: Any,
    correlation_id: str,
    process_id: str | None = None,
    msg_timestamp: str | None = None,
    expires_at: str | None = None,
    priority: int | None = None,
) -> MessageView:
    """Store one message (through the ingress's AcceptBatcher): its view, `duplicate` when (source system,
    correlation id) was stored already (then nothing new is). `priority`: checked (`priority`); None, the
    route's."""
    # The request's trace context travels with the item: the batcher stores it among other requests'.
    view: MessageView = await request.app.state.batcher.submit(
        dict(
            route=route.name,
            payload=payload,
            source_system=system,
            correlation_id=correlation_id,
            process_id=process_id,
            msg_timestamp=msg_timestamp,
            expires_at=expires_at,
            traceparent=tracing.current_traceparent(),
            priority=priority,
        )
    )
    request.state.message_id = view.id
    if not view.duplicate:
        metrics.accepted(route.name, system)
    return view
