"""/healthz (the process answers) and /readyz (the message store and the broker answer)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from openhub.api.problems import refusals
from openhub.api.served import ServedHub
from openhub.engine.hub import Hub

log = logging.getLogger("openhub.api.health")
router = APIRouter(tags=["health"])


def _reason(what: str, exc: Exception) -> str:
    # Driver messages name hosts, ports, users and databases: they go to the log, not to whoever
    # asks /readyz.
    log.warning(
        "readiness: %s unavailable: %s: %s", what, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""
    )
    return "unavailable"


def check_database(hub: Hub) -> str | None:
    """None when `SELECT 1` succeeds on `hub`'s database, else a generic reason (the detail is logged)."""
    try:
        with hub.transaction() as conn:
            conn.execute(text("SELECT 1"))
        return None
    except Exception as exc:
        return _reason("database", exc)


def check_broker() -> str | None:
    """None when a broker connection can be opened (one retry), else a generic reason (the detail is logged).
    The broker is the process's Celery application's, the one every hub of the process publishes to
    (openhub.celery.dispatch.CeleryPublisher)."""
    from openhub.celery.dispatch import celery_app

    try:
        with celery_app().connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, timeout=2)
        return None
    except Exception as exc:
        return _reason("broker", exc)


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    """Always 200 while the process serves requests."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: database and broker reachable",
    responses=refusals(said={503: "The database or the broker is unreachable"}),
)
def readyz(hub: ServedHub) -> JSONResponse:
    """200 when both the message store and the broker answer, 503 (naming which is unavailable) otherwise."""
    checks: dict[str, Any] = {"database": check_database(hub), "broker": check_broker()}
    ready = all(v is None for v in checks.values())
    body = {
        "status": "ready" if ready else "unavailable",
        "checks": {k: ("ok" if v is None else v) for k, v in checks.items()},
    }
    return JSONResponse(body, status_code=200 if ready else 503)
