"""A payment authorised asynchronously: the bank answers later through the API.

`authorize` sends the request, with the URL the bank answers to (`ctx.response_url`: this ask's
token in it), and parks the message in WAITING_FOR_RES; the bank's callback (a POST to that URL with
BANK's key, or `openhub.respond(id, payload, token=...)`, or the CLI; the token may be left out while the
message waits for its first answer) resumes the route with the answer in `ctx.response`. No answer
within the timeout counts as a transient failure and the request is sent again, with a new token. A
`Holdback` from the bank (maintenance) pauses the whole route until an operator resumes it.
"""

from __future__ import annotations

import os
from datetime import timedelta

import httpx

from openhub import Holdback, Reject, Route, StepContext, step

from .customers import EXTERNAL

HUB = os.environ.get("OPENHUB_EXAMPLE_HUB_URL", "http://127.0.0.1:8000")  # where the bank reaches the hub's API


@step(timeout=timedelta(seconds=30))
def authorize(ctx: StepContext) -> None:
    """Ask the bank to authorise; it answers asynchronously."""
    r = httpx.post(
        f"{EXTERNAL}/bank/authorizations",
        json={**ctx.payload, "callback": ctx.response_url(HUB)},
        headers={"Idempotency-Key": ctx.idempotency_key},
        timeout=10,
    )
    if r.status_code == 423:
        raise Holdback("the bank is in maintenance")
    r.raise_for_status()
    ctx.wait_for_response(timedelta(minutes=10))


@step
def capture(ctx: StepContext) -> None:
    """Capture an approved payment; a declined one is refused for good."""
    if not (ctx.response or {}).get("approved"):
        raise Reject("payment declined by the bank", code="E402")
    httpx.post(
        f"{EXTERNAL}/bank/captures",
        json={"payment": ctx.payload["paymentId"]},
        headers={"Idempotency-Key": ctx.idempotency_key},
        timeout=10,
    ).raise_for_status()


# The shop (or CRM) asks; only the bank (or an operator) may answer: the asker cannot approve itself.
routes = [
    Route(
        "payment.authorize",
        steps=[authorize, capture],
        object_id=lambda p: p.get("paymentId"),
        sources=["CRM", "SHOP"],
        responders=["BANK"],
        errors={"E402": "the bank declined the payment"},
    )
]
