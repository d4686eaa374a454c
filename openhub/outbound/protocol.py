"""The stock confirmation protocol: the one callback a source system implements to hear how each of its
messages ended, set up per system without code (OPENHUB_CONFIRM_ENDPOINTS, openhub.core.endpoints).

The hub POSTs one `Confirmation` per final message (OK, FAILED, CANCEL; those of the endpoint's `states`)
to the system's URL: JSON (its JSON Schema is `GET /api/v1/schemas/confirmation`), or with `format: soap`
a SOAP 1.1 envelope holding conf:confirmation (`openhub.core.soapxml.CONFIRMATION_XSD`, served at
`GET /api/v1/schemas/confirmation.xsd`). Every POST is signed the Standard Webhooks way with the system's
own OPENHUB_CONFIRM_SECRETS secret over the exact body bytes; `webhook-id`, the Idempotency-Key and the
body's `delivery_id` are the same on every retry of one confirmation, for the receiver to dedupe by. Any
2xx answer within the endpoint's timeout is a success; anything else is retried as its retry policy says
(openhub.confirm, `policy.confirmation_retry`), "forever" included. A `@confirmation` function for the
same system overrides its endpoint.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from openhub.core.context import Outcome
from openhub.core.endpoints import ConfirmEndpoint
from openhub.core.signing import signature_headers
from openhub.core.soapxml import confirmation_envelope
from openhub.outbound.notify import post_signed, post_within, settings_of, signing_keys

PROTOCOL = "openhub.confirmation/1"


class BusinessError(BaseModel):
    """A business error a step recorded (`ctx.business_error(code, text)`)."""

    code: str
    text: str


class Confirmation(BaseModel):
    """What the hub POSTs to a source system's confirmation endpoint once its message is final."""

    model_config = ConfigDict(
        extra="allow", title="openhub confirmation", json_schema_extra={"$id": "urn:openhub:confirmation:1"}
    )
    protocol: Literal["openhub.confirmation/1"] = Field(description="This contract and its version.")
    delivery_id: str = Field(
        description="The same on every retry of this confirmation (also `webhook-id` "
        "and Idempotency-Key): dedupe by it."
    )
    id: int = Field(description="The hub's id of the message.")
    correlation_id: str = Field(description="The id the source system gave the message.")
    source_system: str
    route: str = Field(description="`service.operation`.")
    process_id: str | None = None
    state: Literal["OK", "FAILED", "CANCEL"] = Field(description="How the message ended.")
    error_code: str | None = Field(None, description="FAILED: the failure's searchable code.")
    failed_error: str | None = Field(None, description="FAILED: one line of the error.")
    business_errors: list[BusinessError] = Field(
        default_factory=list, description="Business errors recorded on the way (any state)."
    )


def schema() -> dict[str, Any]:
    """The JSON Schema of the contract (what `GET /api/v1/schemas/confirmation` answers)."""
    document = Confirmation.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return document


def body(outcome: Outcome) -> dict[str, Any]:
    """The confirmation of `outcome` as the contract has it."""
    return {"protocol": PROTOCOL, "delivery_id": outcome.webhook_id, **outcome.as_dict()}


def stock_confirmer(endpoint: ConfirmEndpoint) -> Callable[[Outcome], None]:
    """The confirmer that sends `endpoint`'s system its confirmations by the protocol; it carries the endpoint
    (`confirmer.endpoint`: its retry policy) and the states it confirms (`confirmer.states`)."""

    def confirm(outcome: Outcome) -> None:
        seconds = (endpoint.timeout or settings_of(outcome).confirm_timeout).total_seconds()
        keys = signing_keys(outcome)  # the system's own OPENHUB_CONFIRM_SECRETS secret
        if endpoint.format == "json":
            post_signed(endpoint.url, seconds, body(outcome), outcome.webhook_id, keys, endpoint.headers)
            return
        data = confirmation_envelope(body(outcome))
        headers = {
            **endpoint.headers,
            "Content-Type": "text/xml; charset=utf-8",
            "SOAPAction": '"urn:openhub:confirmation"',
            "Idempotency-Key": outcome.webhook_id,
            **signature_headers(keys, outcome.webhook_id, int(time.time()), data),
        }
        post_within(endpoint.url, seconds, content=data, headers=headers)

    confirm.__qualname__ = confirm.__name__ = f"confirmation protocol to {endpoint.system}"
    confirm.endpoint = endpoint  # type: ignore[attr-defined]
    confirm.states = endpoint.states  # type: ignore[attr-defined]
    return confirm
