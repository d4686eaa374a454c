"""/api/v1/breakers: the circuit breakers of the external systems, and an operator's reset or force-open."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from openhub.api.auth import Caller, viewer
from openhub.api.auth import operator as can_operate
from openhub.api.problems import NO_CONTROL, refusals
from openhub.api.served import ServedHub
from openhub.service import breakers as operator

router = APIRouter(prefix="/api/v1/breakers", tags=["routes"])
_ERRORS = refusals(401, 403, 503, said={400: "No reason, or a bad duration", 404: "No step calls this system"})
System = Annotated[str, Path(max_length=100)]


class BreakerChange(BaseModel):
    """Why an operator resets or opens a breaker (kept in the audit trail), and for how long it stays open."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(..., min_length=1, max_length=500, json_schema_extra=NO_CONTROL)
    seconds: float | None = Field(
        None, gt=0, le=7 * 86400, description="Open: for how long (default OPENHUB_BREAKER_OPEN); then one step tries."
    )


@router.get("", summary="Every external system's breaker", responses=_ERRORS)
def list_breakers(_: Annotated[Caller, Depends(viewer)], hub: ServedHub) -> list[dict[str, Any]]:
    """Each system a step calls (`@step(system=...)`): open or not, until when, failures in a row, and why an
    operator opened it."""
    return operator.breakers(hub=hub)


@router.post("/{system}:reset", summary="Close a system's breaker", responses=_ERRORS)
def reset_breaker(
    system: System, change: BreakerChange, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub
) -> dict[str, Any]:
    """Its failure count goes to 0: the steps it postponed call the system when they are next due."""
    return operator.reset_breaker(system, change.reason, hub=hub)


@router.post("/{system}:open", summary="Force a system's breaker open", responses=_ERRORS)
def open_breaker(
    system: System, change: BreakerChange, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub
) -> dict[str, Any]:
    """Its steps are postponed without counting a failure until the time is up; then one step tries."""
    return operator.open_breaker(system, change.reason, change.seconds, hub=hub)
