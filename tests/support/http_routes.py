"""Routes that call a scripted HTTP server through `openhub.outbound.http.HttpCall` (tests/integration/test_http.py).

The payload names the path to call; the server's script for that path decides the answer.
"""

from __future__ import annotations

import os

from openhub import Route, StepContext, step
from openhub.outbound.http import HttpCall

api = HttpCall(
    business_errors={409: "E409"},
    reject={400, 404, 422},
    record=True,
    timeout=2,
    headers={"Authorization": "Bearer s3cret", "X-Api-Key": "k-123"},
)
quiet = HttpCall()  # records nothing
headers_only = HttpCall(record="headers")  # records the exchange without its bodies


def server() -> str:
    """The test's scripted server (read per call: each test starts its own)."""
    return os.environ["OPENHUB_TEST_HTTP_URL"]


@step
def call_api(ctx: StepContext) -> None:
    """POST the payload; keep the answer's id when there is one."""
    r = api.post(ctx, f"{server()}{ctx.payload['path']}", json=ctx.payload)
    if r.is_success:
        ctx.custom_data["id"] = r.json().get("id")


@step
def call_quietly(ctx: StepContext) -> None:
    """The same call without recording."""
    quiet.post(ctx, f"{server()}{ctx.payload['path']}", json=ctx.payload)


@step
def get_token(ctx: StepContext) -> None:
    """An OAuth-style form POST whose body carries the client secret."""
    api.post(
        ctx,
        f"{server()}{ctx.payload['path']}",
        data={"grant_type": "client_credentials", "client_secret": ctx.payload["secret"]},
    )


@step
def call_headers_only(ctx: StepContext) -> None:
    """The same call as call_api, recorded without bodies."""
    headers_only.post(ctx, f"{server()}{ctx.payload['path']}", json=ctx.payload)


E409 = {"E409": "the called API answered 409"}
routes = [
    Route("http.call", steps=[call_api], errors=E409),
    Route("http.quiet", steps=[call_quietly], errors=E409),
    Route("http.token", steps=[get_token], errors=E409),
    Route("http.headers_only", steps=[call_headers_only], errors=E409),
]
