"""The bodies of /api/v1/messages: what its requests carry and its answers say (pydantic models, shown in the
OpenAPI document), the refusals each endpoint documents, and the limits they share."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from openhub.api import ingress
from openhub.api.auth import Caller
from openhub.api.auth import operator as can_operate
from openhub.api.problems import NO_CONTROL, ApiError, refusals
from openhub.core.errors import InputError
from openhub.core.registry import Registry
from openhub.core.states import State
from openhub.service import actions as operator

MAX_ID = 2**63 - 1
BATCH_MAX_MESSAGES = 1000
BATCH_BODY_FACTOR = 10  # a batch body may be this many times OPENHUB_MAX_PAYLOAD_BYTES

Operating = Annotated[Caller, Depends(can_operate)]
MessageId = Annotated[int, Path(ge=1, le=MAX_ID, description="The message's id.")]


def _not_a_number(value: Any) -> Any:
    # pydantic reads a number (or text that is one) as seconds since 1970: `received_to=0.5` would
    # search up to 1970-01-01T00:00:00.5 instead of being refused as the mistake it is.
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, (int, float)) or text:
        try:
            float(value if text is None else text)
        except ValueError:
            return value
        raise ValueError("must be an ISO 8601 timestamp, not a number")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_not_a_number)]
"""A datetime given as ISO 8601 text (or a datetime); a number is refused, never read as epoch seconds."""
# Fields below are strict where pydantic's lax mode would turn a wrong type into a value:
# `{"total": 0}` a bool, `{"limit": "5"}` or `{"limit": 5.0}` an int.


class Accepted(BaseModel):
    """The answer to a submission: the stored message's id and state."""

    id: int
    correlation_id: str
    route: str
    state: str
    duplicate: bool = Field(
        description="True when (source system, correlation id) was already stored; "
        "nothing new was stored and this is the first message."
    )


class BatchItem(BaseModel):
    """One message of a batch: the route (or service and operation), payload and correlation id."""

    model_config = ConfigDict(extra="forbid")
    route: str | None = Field(
        None, description="`service.operation`; or give `service` and `operation`.", examples=["customer.setCustomer"]
    )
    service: str | None = None
    operation: str | None = None
    payload: Any = Field(..., description="The message payload (any JSON value).")
    correlation_id: str = Field(..., min_length=1, max_length=255)
    process_id: str | None = Field(None, max_length=255)
    msg_timestamp: str | None = Field(None, description="ISO 8601; orders versions of one entity.")
    expires_at: str | None = Field(None, description="ISO 8601; not started by then, it ends FAILED (EXPIRED).")
    source_system: str | None = Field(None, description="If given, must be the API key's own source system.")
    priority: int | None = Field(None, description="0-9, higher = sooner; none: the route's default.")


class Batch(BaseModel):
    """A batch of messages accepted all-or-nothing in one transaction."""

    model_config = ConfigDict(extra="forbid")
    messages: list[BatchItem] = Field(..., min_length=1, max_length=BATCH_MAX_MESSAGES)


def extra_schemas() -> dict[str, Any]:
    """Component schemas of request bodies the endpoints read themselves (to enforce the size limit first)."""
    schema = Batch.model_json_schema(ref_template="#/components/schemas/{model}")
    found = dict(schema.pop("$defs", {}))
    found["Batch"] = schema
    return found


class BatchAccepted(BaseModel):
    """The answer to a batch, in the order of the request."""

    messages: list[Accepted]


class RestartRequest(BaseModel):
    """Options of a restart."""

    model_config = ConfigDict(extra="forbid")
    total: bool = Field(False, strict=True, description="Also forget OK external calls, so every call is made again.")
    from_step: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        json_schema_extra=NO_CONTROL,
        description="Restart from this step of the route: its and the later steps' "
        "call records are cleared, the earlier steps are not called again.",
    )


class Resubmission(BaseModel):
    """The corrected payload of a FAILED message."""

    model_config = ConfigDict(extra="forbid")
    payload: Any = Field(..., description="The new payload (any JSON value), checked as a submission's is.")


class Matching(BaseModel):
    """The messages a bulk action acts on: those matching every given filter (at least one), oldest first."""

    model_config = ConfigDict(extra="forbid")
    state: State | None = None
    route: str | None = Field(None, max_length=201, description="`service.operation`.")
    service: str | None = Field(None, max_length=100)
    operation: str | None = Field(None, max_length=100)
    source_system: str | None = Field(None, max_length=100)
    correlation_id: str | None = Field(None, max_length=320)
    error_code: str | None = Field(None, max_length=100)
    process_id: str | None = Field(None, max_length=255)
    object_id: str | None = Field(None, max_length=255)
    parent_id: int | None = Field(None, strict=True, ge=1, le=MAX_ID)
    received_from: Timestamp | None = None
    received_to: Timestamp | None = None
    limit: int = Field(operator.BULK_LIMIT, strict=True, ge=1, le=operator.BULK_LIMIT)

    def filters(self, registry: Registry) -> dict[str, Any]:
        no_nul(
            route=self.route,
            service=self.service,
            operation=self.operation,
            source_system=self.source_system,
            correlation_id=self.correlation_id,
            error_code=self.error_code,
            process_id=self.process_id,
            object_id=self.object_id,
        )
        service, operation = self.service, self.operation
        if self.route is not None:
            if service is not None or operation is not None:
                raise InputError("give either route or service and operation")
            service, operation = registry.route(self.route).name.split(".", 1)
        return dict(
            state=self.state.value if self.state else None,
            service=service,
            operation=operation,
            source_system=self.source_system,
            correlation_id=self.correlation_id,
            error_code=self.error_code,
            process_id=self.process_id,
            object_id=self.object_id,
            parent_id=self.parent_id,
            limit=self.limit,
            received_from=ingress.utc(self.received_from, "received_from"),
            received_to=ingress.utc(self.received_to, "received_to"),
        )


class RestartMatching(Matching):
    """A bulk restart: the filters, and whether every external call is made again."""

    total: bool = Field(False, strict=True, description="Also forget OK external calls, so every call is made again.")


class BulkDone(BaseModel):
    """What a bulk action did."""

    done: list[int] = Field(description="The messages acted on, oldest first.")
    refused: list[dict[str, Any]] = Field(description="`{id, reason}` of matching messages that had moved on.")
    more: bool = Field(description="More messages match than `limit`: run the action again for them.")


class MessageSummary(BaseModel):
    """A message as a list shows it: no payload, every field bounded (the detail has the rest)."""

    id: int
    route: str
    service: str
    operation: str
    state: str
    source_system: str
    correlation_id: str
    process_id: str | None
    object_id: str | None
    entity_type: str | None
    parent_id: int | None
    failed_count: int
    failed_step: str | None
    failed_error: str | None = Field(description="One line of the error (a traceback: its exception), bounded.")
    error_code: str | None = Field(default=None, description="The last failure's searchable code.")
    received_at: str
    msg_timestamp: str | None
    finished_at: str | None


class MessagePage(BaseModel):
    """One page of message summaries, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[MessageSummary]
    next_cursor: int | None


ERRORS = refusals(  # a source system's key, and what the store's refusal means for a submission
    said={
        400: "Malformed request, bad payload or payload refused by the route's validation",
        401: "Missing or invalid API key",
        403: "The key may not do this",
        404: "Unknown route or message",
        409: "The message's state does not allow this",
        413: "Body over OPENHUB_MAX_PAYLOAD_BYTES",
        415: "Unsupported media type",
        429: "Throttled; see Retry-After",
        503: "Message store unavailable; nothing stored",
    }
)

PAYLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The payload: JSON, or text/XML stored as a JSON string.",
        "content": {
            "application/json": {"schema": {}},
            "text/plain": {"schema": {"type": "string"}},
            "application/xml": {"schema": {"type": "string"}},
        },
    }
}


def no_nul(**values: str | None) -> None:
    for name, value in values.items():
        if value is not None and "\x00" in value:
            raise ApiError(400, f"{name} must not contain NUL characters")
