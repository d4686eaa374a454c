"""Routes of the API tests alone: accept-time validation (for the 400 tests, which send them only refused
payloads), routes named like the operator's actions (issue 40), and one whose payload's card fields are
secret, for the planted-secret fuzz (its route is paused meanwhile)."""

from pydantic import BaseModel

from openhub import Route, Soap, StepContext, step
from tests.support.routes import SOAP_XSD


@step
def never_called(ctx: StepContext) -> None:
    """The API tests submit only payloads the validation refuses, so no worker ever runs this."""


@step
def nothing_to_do(ctx: StepContext) -> None:
    """A step that calls nothing: what matters of its routes is their names."""


class Customer(BaseModel):
    """The payload `api.typed` accepts."""

    externalCustomerId: str
    age: int | None = None


OPERATOR_NAMED = ["order.cancel", "shipment.restart", "x.response"]
"""Routes named like the operator's actions, which once could not be submitted over HTTP."""

routes = [
    Route("api.validated", steps=[never_called], validate=lambda p: isinstance(p, dict) and "ok" in p),
    Route("api.typed", steps=[never_called], validate=Customer),
    Route("api.carded", steps=[never_called], secret_fields=["card.pin", "card.cvc"]),
    *(Route(name, steps=[nothing_to_do]) for name in OPERATOR_NAMED),
    # a SOAP route that SHOP alone may submit to, and whose validate= refuses an id of "0"
    Route(
        "soapsrc.setCustomer",
        steps=[never_called],
        soap=Soap(xsd=SOAP_XSD, element="customer"),
        sources=["SHOP"],
        validate=lambda p: p["id"] != "0",
    ),
]
