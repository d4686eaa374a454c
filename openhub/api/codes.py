"""/api/v1/errors: the error-code catalogue (openhub.service.catalogue), each code with the number of stored
messages whose last failure carries it and the messages search that lists them (operators: admin token)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from openhub.api.auth import Caller, admin
from openhub.api.problems import refusals
from openhub.api.served import ServedHub
from openhub.service import catalogue

router = APIRouter(prefix="/api/v1/errors", tags=["errors"])
_ERRORS = refusals(401, 503, said={403: "Needs the admin token"})


@router.get(
    "", summary="Every error code: meaning, retried or not, what to do, messages carrying it", responses=_ERRORS
)
def list_errors(_: Annotated[Caller, Depends(admin)], hub: ServedHub) -> list[dict[str, Any]]:
    """The hub's codes, then the routes' own (`Route(errors=)`), then codes found on messages that no entry
    describes (`declared: false`). `messages` counts the messages whose last failure has the code; `search`
    is the messages query that lists them (`HTTP_<status>` gives `statuses`, the count per status)."""
    return catalogue.listing(hub=hub)
