"""/api/v1/overview and /api/v1/workers: what the admin page opens on (admin token).

The store figures are cheap (see `openhub.service.overview`) and refreshed every few seconds; the worker
ping costs its whole timeout, so it has its own endpoint that the page asks less often.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from openhub.api.auth import Caller, viewer
from openhub.api.problems import refusals
from openhub.api.served import ServedHub
from openhub.service import overview as figures
from openhub.service import worker_states

router = APIRouter(prefix="/api/v1", tags=["overview"])
_ERRORS = refusals(401, 403, 503)


@router.get(
    "/overview", summary="Messages by route and state, throughput, failures, oldest live messages", responses=_ERRORS
)
def get_overview(_: Annotated[Caller, Depends(viewer)], hub: ServedHub) -> dict[str, Any]:
    """The overview's store figures: see `openhub.service.overview` for what each one counts."""
    return figures.overview(hub=hub)


@router.get("/workers", summary="Celery workers answering a ping, and each worker's state", responses=_ERRORS)
def get_workers(_: Annotated[Caller, Depends(viewer)], hub: ServedHub) -> dict[str, Any]:
    """Workers that answered within half a second; `available: false` when the broker could not be asked.
    `states`: each worker's main process as its heartbeats show it (taking work, finishing, stopped, store
    away, gone; see `openhub.service.worker_states`), `held_hosts`: the hosts an operator holds."""
    # The store's states first: they judge each heartbeat's age as of their read, and the ping below may
    # take seconds on a loaded box (a CI run read a worker that had just beaten as "store away" after it).
    states, held = worker_states.worker_states(hub=hub), worker_states.held_hosts(hub=hub)
    return {**figures.workers(timeout=0.5, hub=hub), "states": states, "held_hosts": held}
