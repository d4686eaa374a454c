"""Routes that send planted secrets every way a route can (tests/integration/test_planted_secrets.py,
bench/fuzz_api.py): in a URL's query, fragment, userinfo and path, in headers the lists name and do not,
in JSON body fields and name/value pairs, in a header value httpx refuses to send, in the payload fields
a route marks secret. The external system (tests/support/planted.py's EchoSystem) echoes each request
back in its answer and its errors, so every secret comes back to the hub, as a hostile or careless
system's answer would. The secrets are read per call from OPENHUB_TEST_PLANTED (JSON: name -> value); the
source system is VAULT, whose confirmations go to OPENHUB_TEST_RECEIVER_URL.
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

from openhub import Outcome, Route, StepContext, confirmation, on_state, step
from openhub.outbound.http import HttpCall
from openhub.outbound.notify import webhook

echo = HttpCall(record=True, timeout=5, business_errors={409: "E409"})


def planted() -> dict[str, str]:
    """The secrets of this run."""
    return json.loads(os.environ["OPENHUB_TEST_PLANTED"])


def server() -> str:
    """The echoing external system."""
    return os.environ["OPENHUB_TEST_ECHO_URL"]


def with_userinfo() -> str:
    """The echoing external system with the planted password in its userinfo (httpx sends it as Basic auth
    in place of any Authorization header: used where no other is sent)."""
    base = urlsplit(server())
    return f"{base.scheme}://svc:{planted()['userinfo']}@{base.netloc}"


def _headers() -> dict[str, str]:
    s = planted()
    return {
        "Authorization": f"Bearer {s['bearer']}",
        "X-Functions-Key": s["functions_key"],
        "X-Access-Key": s["access_key"],
        "X-Pass": s["pass_header"],
        "X-Hub-Key": s["hub_key"],
        "Ocp-Apim-Subscription-Key": s["subscription"],
    }


def _query() -> str:
    s = planted()
    return (
        f"api_key={s['api_key']}&pass={s['query_pass']}&pwd={s['query_pwd']}&access_key={s['query_access']}"
        f"&private_key={s['query_private']}&jwt={s['jwt']}&page=2#access_token={s['fragment']}"
    )


def _body(ctx: StepContext) -> dict:
    s = planted()
    return {
        "order": ctx.payload.get("order"),
        "client_secret": s["client_secret"],
        "pwd": s["body_pwd"],
        "pin": s["body_pin"],
        "privateKey": s["private_key"],
        "nested": {"password": s["nested_password"]},
        "fields": [{"name": "password", "value": s["name_value"]}, {"name": "user", "value": "ann"}],
    }


@step
def call_and_fail(ctx: StepContext) -> None:
    """A call answered 500 echoing the request (a transient failure whose text holds the echo), then
    400 (a Reject)."""
    ctx.log.warning("calling %s/fail?%s", server(), _query())  # a step's own line, with the URL as is
    echo.post(ctx, f"{server()}/fail?{_query()}", json=_body(ctx), headers=_headers())


@step
def call_ok(ctx: StepContext) -> None:
    """A call answered 409 echoing the request: a business error whose text holds the echo, and OK."""
    echo.post(ctx, f"{server()}/conflict?{_query()}", json=_body(ctx), headers=_headers())


@step
def call_a_webhook_url(ctx: StepContext) -> None:
    """A Slack-style URL whose path is the credential, answered 503 with the URL echoed."""
    echo.post(ctx, f"{with_userinfo()}/services/T0AAA1111/B0BBB2222/{planted()['path_token']}", json={"text": "hi"})


@step
def send_a_newline(ctx: StepContext) -> None:
    """A token with a trailing newline in a header: httpx refuses the request, its error names the value."""
    echo.post(ctx, f"{server()}/never", headers={"Authorization": f"Bearer {planted()['newline_token']}\n"})


@step
def refuse_the_card(ctx: StepContext) -> None:
    """A step whose error and log line quote the payload's secret field (the route marks it secret)."""
    ctx.log.info("charging card %s", ctx.payload["card"])
    ctx.business_error("E402", f"card {ctx.payload['card']} declined")
    raise RuntimeError(f"card {ctx.payload['card']} refused by the bank")


routes = [
    Route("secret.fail", steps=[call_and_fail], errors={"E409": "the echo system answered 409"}),
    Route("secret.conflict", steps=[call_ok], errors={"E409": "the echo system answered 409"}),
    Route("secret.webhook", steps=[call_a_webhook_url], errors={"E409": "the echo system answered 409"}),
    Route("secret.newline", steps=[send_a_newline], errors={"E409": "the echo system answered 409"}),
    Route(
        "secret.card",
        steps=[refuse_the_card],
        secret_fields=["card.pin", "card.cvc"],
        errors={"E402": "the card was declined"},
    ),
]


@confirmation("VAULT")
def confirm_vault(outcome: Outcome) -> None:
    """Confirm to the source system's receiver (its URL carries a planted token), signed with VAULT's secret."""
    webhook(f"{os.environ['OPENHUB_TEST_RECEIVER_URL']}/confirm?token={planted()['receiver_token']}", 5)(outcome)


@on_state("FAILED")
def tell_the_operators(outcome: Outcome) -> None:
    """The operators' alert, to the same receiver."""
    webhook(f"{os.environ['OPENHUB_TEST_RECEIVER_URL']}/alert?token={planted()['receiver_token']}", 5)(outcome)
