"""A customer update carried to two external systems: billing, then the mobile network operator.

`update_billing` runs once per message; `activate_sim` has entity scope: it runs once per
customer version, and an older message for the same customer that is retried after a newer
one succeeded is SKIPPED as obsolete instead of overwriting newer data.

Both calls go through `openhub.outbound.http.HttpCall`: it sends the idempotency key and correlation id,
retries 5xx and timeouts, and records each request and response with the message (shown in
/admin and `openhub messages show`).
"""

from __future__ import annotations

import os
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from openhub import RetryPolicy, Route, StepContext, step
from openhub.outbound.http import HttpCall

EXTERNAL = os.environ.get("OPENHUB_EXAMPLE_URL", "http://127.0.0.1:8765")

# 409: the customer exists already, which billing's callers must hear about but which is no failure.
billing = HttpCall(business_errors={409: "E410"}, reject={400, 422}, record=True, timeout=10)
mno = HttpCall(reject={400, 404, 422}, record=True, timeout=10)


@step
def update_billing(ctx: StepContext) -> None:
    """Create or update the customer in billing; 409 is a business error, 5xx is retried."""
    r = billing.post(ctx, f"{EXTERNAL}/billing/customers", json=ctx.payload)
    if r.is_success:
        ctx.custom_data["billing_id"] = r.json().get("id")


@step(key="mno", scope="entity", timeout=timedelta(seconds=30))
def activate_sim(ctx: StepContext) -> None:
    """Activate the customer's SIM at the network operator, with the billing id from the first step."""
    body = {"customer": ctx.payload["externalCustomerId"], "billing_id": ctx.custom_data.get("billing_id")}
    mno.post(ctx, f"{EXTERNAL}/mno/activations", json=body)


class CustomerUpdate(BaseModel):
    """What the route needs of a payload, checked when it is submitted (other fields go along as they are):
    a refusal names the field and why, e.g. `externalCustomerId: Field required`."""

    model_config = ConfigDict(coerce_numbers_to_str=True)  # 42 is as good an id as "42"
    externalCustomerId: str = Field(min_length=1)


routes = [
    Route(
        "customer.setCustomer",
        steps=[update_billing, activate_sim],
        object_id=lambda p: p["externalCustomerId"],
        entity_type="customer",
        validate=CustomerUpdate,
        sources=["CRM"],
        errors={"E410": "billing already holds a newer version of the customer (HTTP 409)"},
        retry=RetryPolicy(max_fails=5, interval=timedelta(seconds=5), backoff=2, max_interval=timedelta(minutes=5)),
    ),
]

# The CRM hears how each message ended by the stock confirmation protocol, set up without code:
# OPENHUB_CONFIRM_ENDPOINTS=CRM=https://crm.example/openhub/confirm and its signing secret in
# OPENHUB_CONFIRM_SECRETS (README, "Confirmation protocol"; `openhub dev` sets both up). A
# `@confirmation("CRM")` function here would override it.
