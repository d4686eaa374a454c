"""/api/v1/workers/{id}:finish|:resume and /api/v1/hosts/{host}:finish|:resume: an operator tells one worker,
or every worker of a host, to finish what it has and take nothing new, and lets it take work again.

Each worker's state is in `GET /api/v1/workers` (`states`; openhub.service.worker_states).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from openhub.api.auth import Caller
from openhub.api.auth import operator as can_operate
from openhub.api.problems import NO_CONTROL, refusals
from openhub.api.served import ServedHub
from openhub.service import worker_states

router = APIRouter(prefix="/api/v1", tags=["overview"])
_ERRORS = refusals(401, 403, 503, said={400: "No reason, or not a host name", 404: "No such worker"})
WorkerId = Annotated[str, Path(max_length=36, description="The worker's id, as `GET /api/v1/workers` lists it.")]
Host = Annotated[str, Path(max_length=255, description="A host name, as the workers' nodes (host:pid) show it.")]


class Finish(BaseModel):
    """Why a worker or host finishes what it has (shown with the worker, kept in the audit trail)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field("finish by an operator", min_length=1, max_length=500, json_schema_extra=NO_CONTROL)


@router.post(
    "/workers/{worker_id}:finish", summary="A worker finishes what it has and takes nothing new", responses=_ERRORS
)
def finish_worker(
    worker_id: WorkerId, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub, request: Finish | None = None
) -> dict[str, Any]:
    """Within one heartbeat it takes no task from the broker; the tasks it has run to their end. Kept in the
    store: it holds across a broker reconnection, until `:resume`."""
    return worker_states.finish_worker(worker_id, (request or Finish()).reason, hub=hub)


@router.post("/workers/{worker_id}:resume", summary="A held worker takes work again", responses=_ERRORS)
def resume_worker(worker_id: WorkerId, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub) -> dict[str, Any]:
    """Within one heartbeat it takes tasks again (unless its host is held)."""
    return worker_states.resume_worker(worker_id, hub=hub)


@router.post("/hosts/{host}:finish", summary="Every worker of a host finishes what it has", responses=_ERRORS)
def finish_host(
    host: Host, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub, request: Finish | None = None
) -> dict[str, Any]:
    """Every worker on the host, also one started there later, takes nothing new until `:resume`."""
    return worker_states.finish_host(host, (request or Finish()).reason, hub=hub)


@router.post("/hosts/{host}:resume", summary="The workers of a held host take work again", responses=_ERRORS)
def resume_host(host: Host, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub) -> dict[str, Any]:
    """A worker held on its own stays held."""
    return worker_states.resume_host(host, hub=hub)
