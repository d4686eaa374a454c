"""A route with accept-time validation, for the API's 400 test (only refused payloads are sent to it)."""

from openhub import Route, StepContext, step


@step
def never_called(ctx: StepContext) -> None:
    """The API tests submit only payloads the validation refuses, so no worker ever runs this."""


routes = [Route("api.validated", steps=[never_called], validate=lambda p: isinstance(p, dict) and "ok" in p)]
