"""/soap/{service}: the SOAP ingress of the routes that declare `soap=Soap(xsd=..., element=...)`.

`GET /soap/{service}?wsdl` is the service's WSDL (document/literal, SOAP 1.1 and 1.2), built from its
routes' XSDs; `POST /soap/{service}` takes an envelope whose body element names the route (each route of
the service has its own element). The message is admitted exactly as the JSON API's POST admits one
(`ingress`: the same key, by Bearer or HTTP Basic `<source system>:<key>`, the same size limit,
throttling, duplicate check, the route's `sources=` and `validate=`), after the body is parsed safely
and validated and decoded against the XSD (`openhub.core.soapxml`). The answer is hub:AcceptResponse
(message id, state); anything refused is a SOAP fault in the request's version, naming the element
and the reason, with nothing stored. The raw request and the answer are the message's first recorded
exchange (step `soap`).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from openhub.api import body, ingress
from openhub.api.auth import authenticate, submitter
from openhub.api.problems import GENERIC_REASONS, ApiError, refusals, status_for
from openhub.api.served import served
from openhub.core import errors, soapxml
from openhub.core.model import Route
from openhub.store.recordings import Exchange, record_exchange

log = logging.getLogger("openhub.api.soap")
router = APIRouter(tags=["soap"])
CODES = {
    400: "INVALID",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "UNKNOWN_ROUTE",
    409: "DUPLICATE",
    413: "TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    429: "THROTTLED",
    503: "UNAVAILABLE",
}
# A SOAP 1.1 fault is answered 500 (WS-I Basic Profile), save where the HTTP status tells a client what to do.
HTTP_MEANINGFUL = {401, 403, 413, 415, 429, 503}
XML_TYPES = {"text/xml", "application/soap+xml", "application/xml"}
Service = Annotated[str, Path(max_length=100, description="The routes' service (the part before the dot).")]


def soap_routes(request: Request, service: str) -> list[Route]:
    """The routes of `service` that take SOAP, by name."""
    routes = served(request).registry.routes.values()
    return sorted((r for r in routes if r.service == service and r.soap is not None), key=lambda r: r.name)


def _fault(version: int, refused: soapxml.XmlRefused) -> Response:
    status = refused.status if version == 12 or refused.status in HTTP_MEANINGFUL else 500
    return Response(
        soapxml.fault(version, refused),
        status_code=status,
        headers=refused.headers,
        media_type=f"{soapxml.MEDIA[version]}; charset=utf-8",
    )


def _refusal(exc: Exception) -> soapxml.XmlRefused:
    """An API error or an openhub error as a fault's reason (a server-side one without its text)."""
    if isinstance(exc, soapxml.XmlRefused):
        return exc
    if isinstance(exc, ApiError):
        return soapxml.XmlRefused(exc.detail, CODES.get(exc.status, "REFUSED"), status=exc.status, headers=exc.headers)
    if isinstance(exc, errors.Draining):  # an operator's decision, said plainly (as the JSON API does)
        return soapxml.XmlRefused(str(exc), "DRAINING", status=503, headers={"Retry-After": "60"})
    if isinstance(exc, errors.OpenHubError):
        status = status_for(exc)
        if status >= 500:  # a driver's or a route module's text goes to the log, the caller gets the reason
            log.warning("SOAP request refused: %s: %s", type(exc).__name__, exc)
        text = GENERIC_REASONS.get(status, "internal error") if status >= 500 else str(exc)
        return soapxml.XmlRefused(
            text,
            CODES.get(status, "SERVER_ERROR"),
            status=status,
            headers={"Retry-After": "5"} if isinstance(exc, errors.StoreUnavailable) else None,
        )
    log.exception("SOAP request failed")
    return soapxml.XmlRefused("internal error", "SERVER_ERROR", status=500)


@router.get(
    "/soap/{service}",
    summary="The WSDL of a service's SOAP routes (`?wsdl`)",
    response_class=Response,
    responses={
        200: {"content": {"text/xml": {}}},
        **refusals(said={401: "Missing or invalid key", 404: "No route of this service takes SOAP"}),
    },
)
async def service_wsdl(request: Request, service: Service) -> Response:
    """The service's WSDL: one operation per SOAP route, taking its XSD element and answering AcceptResponse.
    Any source system's key (Bearer or Basic) or the admin token reads it."""
    await authenticate(request, basic=True)
    routes = soap_routes(request, service)
    if not routes:
        raise ApiError(404, f"no route of service {service!r} takes SOAP")
    location = str(request.url.replace(query=""))
    document = await run_in_threadpool(
        soapxml.wsdl,
        service,
        [(r.operation, r.soap.xsd, r.soap.element) for r in routes if r.soap is not None],
        location,
    )
    return Response(document, media_type="text/xml; charset=utf-8")


@router.post(
    "/soap/{service}",
    summary="Submit a message of a SOAP route",
    response_class=Response,
    responses={
        200: {"description": "hub:AcceptResponse", "content": {"text/xml": {}}},
        **refusals(said={500: "A SOAP 1.1 fault"}),
    },
)
async def soap_submit(request: Request, service: Service) -> Response:
    """Accept one message as a SOAP envelope (module doc); a SOAP fault for anything refused."""
    version = soapxml.version_of(request.headers.get("content-type"))
    started = time.monotonic()
    try:
        system = await submitter(request, basic=True)
        routes = soap_routes(request, service)
        if not routes:
            raise soapxml.XmlRefused(f"no route of service {service!r} takes SOAP", "UNKNOWN_ROUTE", status=404)
        mime, _ = body.media_type(request)
        if mime not in XML_TYPES:
            raise ApiError(
                415, f"unsupported media type {mime!r}: a SOAP request is text/xml (1.1) or application/soap+xml (1.2)"
            )
        data = await body.read_limited(request, served(request).settings.max_payload_bytes)
        envelope = await run_in_threadpool(soapxml.read_envelope, data, request.headers.get("content-type"))
        version = envelope.version
        route = _route_of(routes, service, envelope.body.tag)
        headers = request.headers
        correlation_id = headers.get("x-correlation-id") or envelope.message_id
        if not correlation_id:
            raise soapxml.XmlRefused(
                "no correlation id: send a WS-Addressing MessageID header (or X-Correlation-Id)",
                "NO_CORRELATION_ID",
                "MessageID",
            )
        correlation_id = ingress.utf8(correlation_id, "the correlation id")
        request.state.correlation_id = correlation_id
        process_id = headers.get("x-process-id") or envelope.process_id or envelope.relates_to
        given = headers.get("x-source-system")
        if given is not None and given != system:
            raise ApiError(403, f"this API key belongs to {system}, not {given}")
        await ingress.check(request, system, route, headers.get("x-message-timestamp"), headers.get("x-expires-at"))
        assert route.soap is not None
        payload = await run_in_threadpool(soapxml.decode, route.soap.xsd, envelope.body)
        view = await ingress.admit(
            request,
            system,
            route,
            payload,
            correlation_id,
            None if process_id is None else ingress.utf8(process_id, "the process id"),
            headers.get("x-message-timestamp"),
            headers.get("x-expires-at"),
        )
        if view.duplicate:
            raise soapxml.XmlRefused(
                f"correlation id {correlation_id!r} of {system} was accepted already, as "
                f"message {view.id}: nothing new was stored",
                "DUPLICATE",
                soapxml.local(envelope.body.tag),
                status=409,
                message_id=view.id,
            )
    except Exception as exc:
        return _fault(version, _refusal(exc))
    answer = soapxml.accept_response(version, view.id, view.correlation_id, view.route, view.state)
    media = f"{soapxml.MEDIA[version]}; charset=utf-8"
    exchange = Exchange(
        message_id=view.id,
        step_key="soap",
        attempt=0,
        method="POST",
        url=str(request.url),
        status=200,
        error=None,
        request_headers=dict(request.headers),
        request_body=data,
        response_headers={"content-type": media},
        response_body=answer,
        duration_ms=int((time.monotonic() - started) * 1000),
        at=datetime.now(timezone.utc),
    )
    try:
        await run_in_threadpool(record_exchange, exchange, served(request).settings)
    except errors.StoreUnavailable as exc:  # the message is stored: its answer must not be lost for a record
        log.warning("message %s: the SOAP request was not recorded (%s)", view.id, exc)
    return Response(answer, media_type=media)


def _route_of(routes: list[Route], service: str, tag: str) -> Route:
    """The route whose XSD element the body is; a fault naming the element and those expected otherwise."""
    expected = {}
    for route in routes:
        assert route.soap is not None
        qname = soapxml.schema_element(route.soap.xsd, route.soap.element)
        if qname == tag:
            return route
        expected[qname] = route.name
    names = ", ".join(f"{q} ({name})" for q, name in expected.items())
    raise soapxml.XmlRefused(
        f"element {tag} is no operation of service {service}: expected one of {names}",
        "UNKNOWN_ELEMENT",
        soapxml.local(tag),
    )
