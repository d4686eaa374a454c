"""/api/v1/routes: the loaded routes, and pausing or resuming one; /api/v1/drain.

Every endpoint here is the operators' (admin token): a source system needs neither the route
table (steps, pause reasons) nor the drain status (messages under way) to submit or to read its
own messages, and a drain already answers its submissions with 503 and Retry-After.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from openhub.api.auth import Caller, viewer
from openhub.api.auth import operator as can_operate
from openhub.api.problems import refusals
from openhub.api.served import ServedHub
from openhub.core.model import route_name
from openhub.core.topics import is_topic, subscribers
from openhub.service import pauses

router = APIRouter(prefix="/api/v1/routes", tags=["routes"])
drain_router = APIRouter(prefix="/api/v1/drain", tags=["routes"])
_ERRORS = refusals(401, 403, 503, said={404: "Unknown route"})
Name = Annotated[str, Path(max_length=100)]


@router.get("", summary="The loaded routes, their steps and whether they are paused", responses=_ERRORS)
def list_routes(_: Annotated[Caller, Depends(viewer)], hub: ServedHub) -> list[dict[str, Any]]:
    """Every route with its steps and, when paused, why; a topic with its subscribers."""
    paused = pauses.paused(hub=hub)
    return [
        {
            "route": r.name,
            "service": r.service,
            "operation": r.operation,
            "steps": [{"key": s.key, "scope": getattr(s, "scope", None)} for s in r.steps],
            "funnel": r.funnel is not None,
            "guaranteed_order": r.guaranteed_order,
            "paused": r.name in paused,
            "paused_reason": paused.get(r.name),
            "subscribes": list(r.subscribes),  # the topics it receives (fan-out)
            # a topic's: the routes each of its messages goes to, one message each
            "subscribers": [s.name for s in subscribers(hub.registry.routes, r.name)] if is_topic(r) else None,
        }
        for r in hub.registry.routes.values()
    ]


@router.post("/{service}/{operation}/pause", summary="Pause a route", responses=_ERRORS)
def pause_route(
    service: Name, operation: Name, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub
) -> dict[str, Any]:
    """Stop starting messages of the route until it is resumed."""
    name = hub.registry.route(route_name(service, operation)).name
    pauses.pause(name, hub=hub)
    return {"route": name, "paused": True}


@router.post("/{service}/{operation}/resume", summary="Resume a paused route", responses=_ERRORS)
def resume_route(
    service: Name, operation: Name, _: Annotated[Caller, Depends(can_operate)], hub: ServedHub
) -> dict[str, Any]:
    """Resume the route; its postponed messages are re-driven at once."""
    name = hub.registry.route(route_name(service, operation)).name
    redriven = pauses.resume(name, hub=hub)
    return {"route": name, "paused": False, "redriven": redriven}


class DrainRequest(BaseModel):
    """Why the hub is drained (shown on the overview)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field("drained by an operator", max_length=500)
    hold_retries: bool = Field(
        True,
        description="True (the default): no stored message starts either (a retry, a postponed or NEW one) until "
        "the drain ends; false: only new messages are refused, the stored ones go on.",
    )


@drain_router.get(
    "", summary="Whether the hub is draining, and how many messages are still under way", responses=_ERRORS
)
def drain_status(_: Annotated[Caller, Depends(viewer)], hub: ServedHub) -> dict[str, Any]:
    """`draining`, its `reason`, `hold_retries` (whether the stored messages wait too), and `under_way`:
    messages still running a step (wait for 0)."""
    return pauses.drain_status(hub=hub)


@drain_router.put(
    "", summary="Drain the hub: refuse new messages, start none, let those under way finish", responses=_ERRORS
)
def start_drain(
    _: Annotated[Caller, Depends(can_operate)], hub: ServedHub, request: DrainRequest | None = None
) -> dict[str, Any]:
    """Submissions answer 503 (Retry-After); with `hold_retries` (the default) no message starts either until
    the drain ends. `PUT` again to switch between the two."""
    request = request or DrainRequest()
    pauses.drain(request.reason, hold_retries=request.hold_retries, hub=hub)
    return pauses.drain_status(hub=hub)


@drain_router.delete("", summary="End the drain: take messages again", responses=_ERRORS)
def end_drain(_: Annotated[Caller, Depends(can_operate)], hub: ServedHub) -> dict[str, Any]:
    """The messages the drain held back are re-driven now (`redriven`)."""
    redriven = pauses.undrain(hub=hub)
    return {**pauses.drain_status(hub=hub), "redriven": redriven}
