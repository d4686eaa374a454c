"""/api/v1/whoami, /api/v1/tokens and /api/v1/audit: who the caller is, the operators' tokens, the trail.

Tokens are the `admin` role's; the audit trail is every operator's to read and nobody's to write:
it has no endpoint that changes it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from openhub.api.auth import Caller, admin, reader, viewer
from openhub.api.problems import NO_CONTROL, refusals
from openhub.api.served import ServedHub
from openhub.engine.intake import to_utc
from openhub.store import audit, tokens

router = APIRouter(prefix="/api/v1", tags=["operators"])
_ERRORS = refusals(400, 401, 403, 503, said={404: "No such token", 409: "The token exists or is revoked already"})
MAX_ID = 2**63 - 1


@router.get("/whoami", summary="Who the presented token is: its name and role", responses=_ERRORS)
def whoami(caller: Annotated[Caller, Depends(reader)]) -> dict[str, Any]:
    """`name` and `role` (viewer, operator, admin) of an operator's token; a source system's key: its system."""
    if caller.role is None:
        return {"name": f"system:{caller.source_system}", "role": "source", "source_system": caller.source_system}
    return {"name": caller.name, "role": caller.role, "source_system": None}


class NewToken(BaseModel):
    """A named operator token to make."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=100, json_schema_extra=NO_CONTROL)
    role: str = Field(..., description="viewer, operator or admin.", json_schema_extra=NO_CONTROL)


@router.get("/tokens", summary="The named operator tokens (never their secrets)", responses=_ERRORS)
def list_tokens(_: Annotated[Caller, Depends(admin)], hub: ServedHub) -> list[dict[str, Any]]:
    """Every named token with its role, who made it and when, and when it was revoked."""
    return tokens.listing(url=hub.settings.database_url)


@router.post("/tokens", status_code=201, summary="Make a named operator token", responses=_ERRORS)
def add_token(new: NewToken, _: Annotated[Caller, Depends(admin)], hub: ServedHub) -> dict[str, Any]:
    """The token's secret is in the answer, and nowhere else ever after: the store keeps its SHA-256."""
    secret = tokens.add(new.name, new.role, url=hub.settings.database_url)
    return {"name": new.name, "role": new.role, "token": secret}


@router.delete("/tokens/{name}", summary="Revoke a named operator token", responses=_ERRORS)
def revoke_token(
    name: Annotated[str, Path(max_length=100)], _: Annotated[Caller, Depends(admin)], hub: ServedHub
) -> dict[str, Any]:
    """Refused from now on; kept, so the audit entries naming it still say who it was."""
    tokens.revoke(name, url=hub.settings.database_url)
    return {"name": name, "revoked": True}


@router.get("/audit", summary="The audit trail: who did what, newest first", responses=_ERRORS)
def list_audit(
    _: Annotated[Caller, Depends(viewer)],
    hub: ServedHub,
    who: Annotated[str | None, Query(max_length=100, json_schema_extra=NO_CONTROL)] = None,
    action: Annotated[
        str | None,
        Query(max_length=50, json_schema_extra=NO_CONTROL, description="e.g. message.restart, hub.drain, token.add"),
    ] = None,
    since: Annotated[datetime | None, Query(description="ISO 8601, inclusive.")] = None,
    until: Annotated[datetime | None, Query(description="ISO 8601, exclusive.")] = None,
    message_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Entries matching every filter: who (token name), role, when, action, target and messages, old and new
    value (secrets masked), client address, request id."""
    return audit.entries(
        url=hub.settings.database_url,
        who=who,
        action=action,
        since=to_utc(since, "since"),
        until=to_utc(until, "until"),
        message_id=message_id,
        limit=limit,
    )
