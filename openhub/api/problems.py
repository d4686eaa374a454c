"""The one boundary where openhub errors become HTTP answers.

Each OpenHubError subclass the API can meet maps to one status code; the most specific class
wins (UnknownRouteError is an InputError but answers 404). `tests/integration/api` checks
that every error class in `openhub.core.errors` has an entry, so a new error cannot fall through
to a 500. What each endpoint documents it may refuse with (its OpenAPI `responses`) is said here too,
once for the whole API (`refusals`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import compile_path

from openhub.core import errors, live

log = logging.getLogger("openhub.api")

STATUS_BY_ERROR: dict[type[errors.OpenHubError], int] = {
    errors.UnknownRouteError: 404,
    errors.PayloadTooLarge: 413,
    errors.SourceNotAllowed: 403,
    errors.InputError: 400,
    errors.NotFound: 404,
    errors.StaleResponse: 409,  # an answer for a wait that has ended: the responder must not retry it
    errors.ResponseTokenNeeded: 409,  # an answer that could be taken for the wrong wait without its token
    errors.StateConflict: 409,
    errors.StoreUnavailable: 503,
    errors.Draining: 503,
    errors.Backlogged: 429,
    errors.WebhookSignatureError: 400,  # raised by receivers' verify_signature, never by the hub's own API
    errors.ConfigurationError: 500,  # a broken route module: the operator's problem, not the caller's
    live.UnknownSetting: 404,  # `PUT /api/v1/config/{name}` of no setting (openhub.service.settings says NotFound)
    live.NeedsRestart: 409,  # ... of a setting read at start-up (StateConflict there)
}


# What each refusal means, as the OpenAPI document says it for every endpoint that does not say it more exactly
# (`refusals(said=...)`): the one map of documented refusals for the whole API.
REFUSALS: dict[int, str] = {
    400: "Bad request",
    401: "Missing or invalid credentials",
    403: "Needs a higher role",
    503: "Message store unavailable",
}


def refusals(*statuses: int, said: Mapping[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of an endpoint that may refuse with `statuses` and with those `said` describes:
    each in `said`'s words where it has them (what an endpoint's 404 or 409 means is its own), else
    REFUSALS'; in status order."""
    said = said or {}
    return {status: {"description": said.get(status) or REFUSALS[status]} for status in sorted({*statuses, *said})}


GENERIC_REASONS = {
    500: "the hub is misconfigured; the operators have been told in its log",
    503: "the message store is unavailable; nothing was stored, retry later",
}


class Problem(BaseModel):
    """The body of every refusal and error the API answers."""

    status: int
    detail: str


# The JSON schema of a text the store refuses with control characters in it (store.CONTROL), for the
# OpenAPI document's generated clients and fuzzers; the check itself stays in the store, whose 400
# names the field.
NO_CONTROL = {"pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029]*$"}


class ApiError(Exception):
    """An HTTP-level refusal raised by the API itself (auth, media type, throttling)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def status_for(exc: errors.OpenHubError) -> int:
    """The HTTP status of an openhub error: the entry of its closest class in the mapping."""
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


def problem(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error body `{"status", "detail"}`."""
    return JSONResponse({"status": status, "detail": detail}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    """Register the exception handlers on `app`."""

    @app.exception_handler(errors.OpenHubError)
    async def _openhub_error(request: Request, exc: errors.OpenHubError) -> JSONResponse:
        status = status_for(exc)
        if isinstance(exc, errors.Draining):  # an operator's decision, said plainly: retry later
            return problem(status, str(exc), {"Retry-After": "60"})
        if isinstance(exc, errors.Backlogged):  # back-pressure: the backlog drains as its messages end
            return problem(status, str(exc), {"Retry-After": str(exc.retry_after)})
        if status >= 500:
            # The text of a 5xx comes from a driver or a route module (host names, user names,
            # paths): it goes to the log, and the caller gets the generic reason.
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
            return problem(
                status,
                GENERIC_REASONS.get(status, "internal error"),
                {"Retry-After": "5"} if isinstance(exc, errors.StoreUnavailable) else None,
            )
        return problem(status, str(exc))

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return problem(exc.status, exc.detail, exc.headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own refusals (a body that is not JSON, no such path, a method the path lacks)
        # get the same Problem body as every other refusal.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method the path has, not only those of the first route matched
            headers["Allow"] = ", ".join(allowed_methods(request))
        return problem(exc.status_code, str(exc.detail), headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # openhub/api/README.md promises 400 for a malformed request, not FastAPI's 422.
        parts = []
        for e in exc.errors():
            loc = tuple(str(p) for p in e.get("loc", ()))
            if len(loc) == 2 and loc[0] == "header":  # said as the caller wrote it: X-Correlation-Id
                header = "-".join(w.capitalize() for w in loc[1].replace("_", "-").split("-"))
                parts.append(
                    f"the {header} header is required"
                    if e.get("type") == "missing"
                    else f"the {header} header: {e.get('msg')}"
                )
            else:
                parts.append(f"{'.'.join(loc)}: {e.get('msg')}")
        return problem(400, "; ".join(parts) or "invalid request")


def allowed_methods(request: Request) -> list[str]:
    """The methods the API documents for the request's path (FastAPI makes a route per method, and
    Starlette's 405 names only those of the first route whose path matched)."""
    path = request.scope.get("path", "")
    return sorted(
        method.upper()
        for template, operations in request.app.openapi().get("paths", {}).items()
        if compile_path(template)[0].match(path)
        for method in operations
    )


PROBLEM_REF = "#/components/schemas/Problem"
INVALID_REQUEST = "Invalid request: a parameter, header or body field of the wrong type, missing or out of range"


def document(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI `schema` as the API answers: 400 (not FastAPI's 422) for an invalid request,
    and every error response with the `Problem` body. Changes `schema` in place and returns it."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:  # the handler above answers these with 400
                responses.setdefault("400", {"description": INVALID_REQUEST})
            for status, response in responses.items():
                if status[0] in "45":
                    response["content"] = {"application/json": {"schema": {"$ref": PROBLEM_REF}}}
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    fastapis = ("HTTPValidationError", "ValidationError")  # the 422 body and its items: unused now
    text = json.dumps([schema.get("paths"), {k: v for k, v in components.items() if k not in fastapis}])
    if not any(f'"#/components/schemas/{name}"' in text for name in fastapis):
        for name in fastapis:
            components.pop(name, None)
    components["Problem"] = Problem.model_json_schema()
    return schema
