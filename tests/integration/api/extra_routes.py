"""Routes with accept-time validation, for the API's 400 tests (only refused payloads are sent to them), and
one whose payload's card fields are secret, for the planted-secret fuzz (its route is paused meanwhile)."""

from pydantic import BaseModel

from openhub import Route, StepContext, step


@step
def never_called(ctx: StepContext) -> None:
    """The API tests submit only payloads the validation refuses, so no worker ever runs this."""


class Customer(BaseModel):
    """The payload `api.typed` accepts."""

    externalCustomerId: str
    age: int | None = None


routes = [Route("api.validated", steps=[never_called], validate=lambda p: isinstance(p, dict) and "ok" in p),
          Route("api.typed", steps=[never_called], validate=Customer),
          Route("api.carded", steps=[never_called], secret_fields=["card.pin", "card.cvc"])]
