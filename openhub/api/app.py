"""The ingress application: `create_app()` is what `openhub serve` and `openhub dev` run.

    uvicorn --factory openhub.api.app:create_app

Routers are listed in `ROUTERS`; errors become HTTP statuses in `problems.py`; every request is
counted for /metrics and logged with its correlation id and message id (never its credentials).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from openhub.api import (
    breakers,
    codes,
    config,
    confirmations,
    health,
    message_actions,
    message_models,
    message_reads,
    messages,
    metrics,
    oidc,
    operators,
    overview,
    problems,
    routes,
    soap,
    workers,
)
from openhub.api.auth import Credentials, FailureLimit, scraper, weaknesses
from openhub.api.batcher import AcceptBatcher
from openhub.api.throttle import Throttle
from openhub.core import tracing
from openhub.core.config import Settings, get_settings
from openhub.core.errors import ConfigurationError, InputError
from openhub.core.live import set_log_level
from openhub.engine.hub import Hub, current, serve_as
from openhub.engine.intake import identifier

log = logging.getLogger("openhub.api")
access_log = logging.getLogger("openhub.api.access")
ADMIN_DIR = Path(__file__).with_name("admin")
ROUTERS = [  # in this order: a path matches the first route whose pattern takes it
    message_reads.router,
    message_actions.router,
    messages.router,  # after the actions: its submission path would swallow their old paths
    soap.router,
    confirmations.router,
    confirmations.schemas_router,
    routes.router,
    routes.drain_router,
    overview.router,
    health.router,
    operators.router,
    breakers.router,
    workers.router,
    codes.router,
    config.router,
]


class AdminFiles(StaticFiles):
    """The admin page's static files, served with headers that keep it from being framed or injected into."""

    HEADERS = {
        "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
    }

    async def get_response(self, path: str, scope: dict) -> Response:  # type: ignore[override]
        response = await super().get_response(path, scope)
        response.headers.update(self.HEADERS)
        return response


class RequestLog:
    """ASGI middleware: count each request for /metrics and log it with its correlation and message ids."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or ("/admin" if scope["path"].startswith("/admin") else "unmatched")
            metrics.http_request(scope["method"], template, status)
            state = scope.get("state") or {}
            correlation_id = state.get("correlation_id") or _header(scope, b"x-correlation-id")
            access_log.info(
                "%s %s %s %.1fms correlation_id=%s message_id=%s",
                scope["method"],
                loggable(scope["path"], 200),
                status,
                (time.perf_counter() - started) * 1000,
                loggable_id(correlation_id),
                state.get("message_id") or "-",
            )


PLAIN = re.compile(r"[A-Za-z0-9._:#@/+-]+")
LOGGED_ID_CHARS = 64


def loggable(text: str, limit: int) -> str:
    """`text` safe for one log line: as is when plain, else quoted with every special character escaped.

    Truncated to `limit` characters: a client must not be able to write megabytes into the log,
    break a line or forge a `key=value` field.
    """
    cut = text[:limit] + ("…" if len(text) > limit else "")
    return cut if PLAIN.fullmatch(cut) else json.dumps(cut)


def loggable_id(value: str | None) -> str:
    """A correlation id for the access log: '-' when absent, 'invalid' when no entry would accept it."""
    if not value:
        return "-"
    try:
        identifier(value, "correlation_id")
    except InputError:
        return "invalid"
    return loggable(value, LOGGED_ID_CHARS)


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value[:1024].decode("latin-1")  # no more is ever logged; 2 MB headers exist
    return None


def create_app(
    dev: bool = False,
    *,
    settings: Settings | None = None,
    credentials: Credentials | None = None,
    throttle: Throttle | None = None,
    announce: Any = print,
    hub: Hub | None = None,
) -> FastAPI:
    """The ingress app serving `hub`; else the hub `settings` describe, built for it (`Hub.build`: their
    routes, their database, publishing to Celery), never the process's hub with other settings; else the
    process's hub (`current()`). In `dev` mode without OPENHUB_API_KEYS a key and an admin token are
    generated and printed.

    Outside `dev`, secrets read from the environment are checked (`auth.weaknesses`): placeholders,
    short or shared secrets stop the start with ConfigurationError.
    """
    if hub is None:
        hub = current() if settings is None else Hub.build(settings)
    elif settings is not None:
        raise TypeError("create_app takes a hub or the settings to build one, not both")
    serve_as("api")  # its settings in force are kept for `openhub config` (openhub.engine.hub.Hub.refresh)
    settings = hub.settings
    set_log_level(settings.log_level)
    if credentials is None:
        credentials = Credentials.from_settings(settings)
        unsafe = [] if dev else weaknesses(credentials, settings.database_url)
        if unsafe:  # only `openhub dev` runs with example or weak secrets
            raise ConfigurationError(
                "refusing to serve with unsafe secrets: "
                + "; ".join(unsafe)
                + ". Generate each with e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`."
            )
        if dev and not credentials.api_keys:
            generated = Credentials.for_development()
            credentials = Credentials(
                generated.api_keys, settings.admin_token or generated.admin_token, metrics_token=settings.metrics_token
            )
            announce(
                "openhub dev: no OPENHUB_API_KEYS set, generated development credentials:\n"
                f"  API key for source system CRM: {credentials.api_keys['CRM']}\n"
                f"  admin token (for /admin):      {credentials.admin_token}\n"
                "  curl -X POST http://127.0.0.1:8000/api/v1/messages/customer/setCustomer \\\n"
                f"    -H 'Authorization: Bearer {credentials.api_keys['CRM']}' -H 'X-Correlation-Id: c-1' \\\n"
                "    -H 'Content-Type: application/json' -d '{\"externalCustomerId\": \"42\"}'"
            )
    if not credentials.api_keys:
        log.warning("no OPENHUB_API_KEYS configured: every submission will be refused (401)")
    if not credentials.admin_token and not settings.oidc_issuer:
        log.warning("no OPENHUB_ADMIN_TOKEN configured: the operator endpoints and /admin are closed")
    if not credentials.admin_token and not credentials.metrics_token:
        log.warning("neither OPENHUB_METRICS_TOKEN nor OPENHUB_ADMIN_TOKEN configured: /metrics is closed")
    app = FastAPI(
        title="openhub",
        version="1",
        description=(
            "Asynchronous integration hub: source systems submit messages, which are persisted and carried "
            "through their route by Celery workers. Authenticate with `Authorization: Bearer <key>`: a source "
            "system's API key (OPENHUB_API_KEYS) to submit and read its own messages, an operator's token for "
            "everything else as far as its role allows: viewer (reads), operator (actions), admin (tokens, "
            "configuration; OPENHUB_ADMIN_TOKEN is one)."
        ),
    )
    app.state.hub = hub  # what the endpoints serve (openhub.api.served)
    app.state.credentials = credentials
    app.state.auth_failures = FailureLimit(settings.auth_failures, settings.auth_window.total_seconds())
    app.state.oidc = oidc.verifier(settings)
    app.state.throttle = throttle or Throttle.from_settings(settings.throttling, settings.redis_url)
    app.state.batcher = AcceptBatcher(hub)
    store_metrics = metrics.StoreCollector(hub)  # the served hub's series, its counters from this app's first scrape
    _warm_up_celery()
    problems.install(app)
    _document_extra_schemas(app)
    for router in ROUTERS:
        app.include_router(router)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics",
        response_class=Response,
        dependencies=[Depends(scraper)],
        responses=problems.refusals(401, said={403: "Needs the metrics or admin token"}),
    )
    def prometheus_metrics() -> Response:
        """Every openhub metric in the Prometheus text format (the metrics token or the admin token)."""
        data, content_type = metrics.render(store_metrics)
        return Response(data, media_type=content_type)

    @app.get("/admin", include_in_schema=False)
    def admin_page() -> RedirectResponse:
        """The admin page lives at /admin/ (its relative links need the slash)."""
        return RedirectResponse("/admin/")

    app.mount("/admin/", AdminFiles(directory=ADMIN_DIR, html=True), name="admin")
    app.add_middleware(RequestLog)
    tracing.instrument_app(app)  # outermost: the request's span covers the request log too
    return app


def _warm_up_celery() -> None:
    # Celery's top-level module loads its members lazily, and that is not thread-safe: the
    # application (which loads them under a lock) is built here, in one thread, before requests come.
    from openhub.celery.dispatch import celery_app

    try:
        celery_app()
    except Exception as exc:
        log.warning("Celery could not be loaded at start-up: %s", exc)


def _document_extra_schemas(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(message_models.extra_schemas())
            app.openapi_schema = problems.document(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def with_settings(**changes: Any) -> Settings:
    """The current settings with some values replaced (tests, the benchmark)."""
    return dataclasses.replace(get_settings(), **changes)
