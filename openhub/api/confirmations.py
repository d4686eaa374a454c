"""/api/v1/confirmations: what the hub told (or could not tell) source systems, and sending it again."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from openhub.api.auth import Caller, viewer
from openhub.api.auth import operator as can_operate
from openhub.api.problems import NO_CONTROL, refusals
from openhub.api.served import ServedHub
from openhub.core.context import aware, error_line
from openhub.core.soapxml import CONFIRMATION_XSD
from openhub.core.states import ConfirmationState
from openhub.outbound import confirm, protocol

router = APIRouter(prefix="/api/v1/confirmations", tags=["confirmations"])
_ERRORS = refusals(
    401,
    503,
    said={400: "Bad filter", 403: "Needs the admin token", 404: "No such confirmation", 409: "Not parked (FAILED_END)"},
)
MAX_ID = 2**63 - 1


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: aware(v).isoformat() if isinstance(v, datetime) else v for k, v in row.items() if k != "claim"}
    out["last_error"] = error_line(row.get("last_error"))  # the whole traceback is in the message's detail
    return out


@router.get("", summary="Confirmations, newest first", responses=_ERRORS)
def list_confirmations(
    _: Annotated[Caller, Depends(viewer)],
    hub: ServedHub,
    state: Annotated[ConfirmationState | None, Query(description="FAILED_END: parked, its attempts ran out.")] = None,
    source_system: Annotated[str | None, Query(max_length=100, json_schema_extra=NO_CONTROL)] = None,
    message_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Each confirmation with its message's source system and correlation id, and the last error's line."""
    return [
        _shown(r)
        for r in confirm.list_confirmations(
            state=state, message_id=message_id, source_system=source_system, limit=limit, settings=hub.settings
        )
    ]


@router.post("/{confirmation_id}/resend", summary="Send a parked confirmation again now", responses=_ERRORS)
def resend(
    confirmation_id: Annotated[int, Path(ge=1, le=MAX_ID)], _: Annotated[Caller, Depends(can_operate)], hub: ServedHub
) -> dict[str, Any]:
    """A FAILED_END confirmation gets a fresh round of attempts, the first one now; the row after it."""
    return _shown(confirm.resend(confirmation_id, settings=hub.settings, registry=hub.registry))


class Parked(BaseModel):
    """Which parked confirmations to send again."""

    model_config = ConfigDict(extra="forbid")
    source_system: str | None = Field(
        None, max_length=100, description="Only this source system's.", json_schema_extra=NO_CONTROL
    )


@router.post(":resend", summary="Send every parked confirmation again", responses=_ERRORS)
def resend_parked(
    _: Annotated[Caller, Depends(can_operate)], hub: ServedHub, parked: Parked | None = None
) -> dict[str, Any]:
    """Every FAILED_END confirmation (of one source system) is due again; the poller sends them."""
    source_system = parked.source_system if parked else None
    return {"resent": confirm.resend_parked(source_system=source_system, settings=hub.settings)}


schemas_router = APIRouter(prefix="/api/v1/schemas", tags=["confirmations"])


@schemas_router.get("/confirmation", summary="The confirmation protocol's JSON Schema")
def confirmation_schema() -> dict[str, Any]:
    """The JSON Schema of what the stock confirmation protocol POSTs to a source system (README,
    "Confirmation protocol"); no credentials needed: it is the contract source systems implement."""
    return protocol.schema()


@schemas_router.get(
    "/confirmation.xsd",
    summary="The confirmation protocol's SOAP variant (XSD)",
    response_class=Response,
    responses={200: {"content": {"application/xml": {}}}},
)
def confirmation_xsd() -> Response:
    """The XSD of conf:confirmation, the body of the protocol's SOAP 1.1 variant (`format: soap`)."""
    return Response(CONFIRMATION_XSD, media_type="application/xml")
