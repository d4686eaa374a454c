"""/api/v1/overview and /api/v1/workers: what the admin page opens on (admin token).

The store figures are cheap (see `openhub.overview`) and refreshed every few seconds; the worker
ping costs its whole timeout, so it has its own endpoint that the page asks less often.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from .. import overview as figures
from .auth import Caller, admin

router = APIRouter(prefix="/api/v1", tags=["overview"])
_ERRORS = {401: {"description": "Missing or invalid credentials"}, 403: {"description": "Needs the admin token"},
           503: {"description": "Message store unavailable"}}


@router.get("/overview", summary="Messages by route and state, throughput, failures, oldest live messages",
            responses=_ERRORS)
def get_overview(_: Annotated[Caller, Depends(admin)]) -> dict[str, Any]:
    """The overview's store figures: see `openhub.overview` for what each one counts."""
    return figures.overview()


@router.get("/workers", summary="Celery workers answering a ping", responses=_ERRORS)
def get_workers(_: Annotated[Caller, Depends(admin)]) -> dict[str, Any]:
    """Workers that answered within half a second; `available: false` when the broker could not be asked."""
    return figures.workers(timeout=0.5)
