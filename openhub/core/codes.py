"""The error-code catalogue: every code the hub itself writes on a failed message, declared once.

A message's last failure carries a short searchable code (`error_code`; `openhub messages list
--error-code`). The hub's own codes are the constants below, each with what it means, whether the hub
retries the message, and what an operator should do; the hub writes only these (tests/unit/test_codes.py
scans the source for any other). A route declares its own codes (`Route(..., errors={"E100": "..."})`,
raised as `Reject(..., code="E100")`, `ctx.business_error("E100", ...)` or an HttpCall's
`business_errors`); openhub.core.declared checks them at load. Listed by `openhub errors`,
`GET /api/v1/errors` and the admin page.

This module imports nothing of openhub's: everything may import it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

# Codes of a step's own failure (openhub.core.failures.error_code, openhub.engine.engine)
REJECTED = "REJECTED"
VALIDATION = "VALIDATION"
INVALID_REQUEST = "INVALID_REQUEST"
TIMEOUT = "TIMEOUT"
CONNECTION = "CONNECTION"
NO_EFFECT = "NO_EFFECT"
SPLIT = "SPLIT"
CUSTOM_DATA = "CUSTOM_DATA"
CUSTOM_KEY = "CUSTOM_KEY"
RESULT = "RESULT"
UNRECORDED = "UNRECORDED"
# Codes the hub writes on its own, no step running
EXPIRED = "EXPIRED"
ORDER_TIMEOUT = "ORDER_TIMEOUT"
WORKER_LOST = "WORKER_LOST"
RESPONSE_TIMEOUT = "RESPONSE_TIMEOUT"
CHILDREN_FAILED = "CHILDREN_FAILED"
# Families: one entry stands for many codes
HTTP = "HTTP_<status>"
EXCEPTION = "<ExceptionClass>"

CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")  # what a route may declare
_HTTP = re.compile(r"^HTTP_([1-5][0-9][0-9])$")
RETRYABLE_4XX = frozenset({408, 425, 429})  # 4xx answers that ask to try again (the rest are fatal)


@dataclass(frozen=True)
class Code:
    """One catalogue entry: `retried` is "yes", "no" or "depends" (then `meaning` says on what)."""

    code: str
    meaning: str
    retried: str
    action: str
    origin: str = "hub"  # "hub", or the route that declared it

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready fields."""
        return asdict(self)


def http(status: int) -> str:
    """The code of an HTTP answer with `status` (HTTP_404)."""
    return f"HTTP_{status}"


CATALOGUE: dict[str, Code] = {
    c.code: c
    for c in (
        Code(
            REJECTED,
            "A step raised Reject without a code: it refused the message for good.",
            "no",
            "Read the message's error; fix the data at the source system and send it again (a new correlation id).",
        ),
        Code(
            VALIDATION,
            "The payload or a step's data failed validation (the route's validate=, a pydantic "
            "ValidationError in a step).",
            "no",
            "Read the error for the field; the source system must send a valid message.",
        ),
        Code(
            INVALID_REQUEST,
            "httpx refused to send the step's request (a newline in a header value, an unknown URL "
            "scheme): the request the step built is malformed, not the external system's fault.",
            "yes",
            "Fix the route's code or the data it builds the request from, then restart the message.",
        ),
        Code(
            TIMEOUT,
            "The external system did not answer within the step's timeout (httpx or socket timeout).",
            "yes",
            "Nothing while retries remain; if it ends FAILED, check the external system's health, then restart.",
        ),
        Code(
            CONNECTION,
            "The external system could not be reached (refused or reset connection, DNS, TLS).",
            "yes",
            "Check the system is up and reachable from the workers; restart the message once it is.",
        ),
        Code(
            HTTP,
            "The external system answered with this status. 4xx other than 408/425/429 fail the message at "
            "once (the request is wrong); 5xx, 408, 425 and 429 are retried (429 after its Retry-After).",
            "depends",
            "4xx: read the recorded exchange (`openhub messages show`), fix the data or the route, restart. "
            "5xx: nothing while retries remain; then check the external system.",
        ),
        Code(
            NO_EFFECT,
            "A step said its call had no effect yet (ctx.no_effect()); tried again later without counting a failure.",
            "yes",
            "Nothing; if it never takes effect, ask the external system why.",
        ),
        Code(
            SPLIT,
            "A splitter's children were refused (an unknown child route, a bad child payload).",
            "no",
            "Fix the route's splitter (its child routes and payloads), then restart the message.",
        ),
        Code(
            CUSTOM_DATA,
            "A step left ctx.custom_data that is not JSON-serialisable.",
            "no",
            "A bug in the route's step: fix it, deploy, restart the message.",
        ),
        Code(
            CUSTOM_KEY,
            "A step's custom_key function failed or gave an unusable key.",
            "no",
            "A bug in the route's step declaration: fix it, deploy, restart the message.",
        ),
        Code(
            RESULT,
            "The last step of a synchronous route (sync=True) returned a value that is not "
            "JSON-serialisable, so it cannot be the route's result.",
            "no",
            "A bug in the route's last step: return JSON data (dict, list, str, number), deploy, then a total "
            "restart (its call succeeded: a plain restart would skip it and end OK without a result).",
        ),
        Code(
            UNRECORDED,
            "The step ran but its outcome could not be written (the store failed meanwhile); what its "
            "call did is kept and the step is tried again.",
            "yes",
            "Check the database's health; nothing to do for the message itself.",
        ),
        Code(
            EXPIRED,
            "The message was not started before its expires_at (the route's expires_after or the "
            "submitter's expiresAt).",
            "no",
            "Nothing if stale data was meant to be dropped; else raise expires_after or find why the queue is slow.",
        ),
        Code(
            ORDER_TIMEOUT,
            "The message waited in its funnel (guaranteed order) behind another longer than the route's order_timeout.",
            "no",
            "Find the message blocking the funnel (`openhub messages list --state FAILED` on the route), settle "
            "it, then restart this one.",
        ),
        Code(
            WORKER_LOST,
            "A step's run ended without an outcome: its worker died or its task crashed. Tried again "
            "at once without counting a failure; FAILED after OPENHUB_MAX_LOST_RUNS lost runs in a row.",
            "yes",
            "If it ended FAILED, the step takes its worker down (memory, a crash): read the worker's log.",
        ),
        Code(
            RESPONSE_TIMEOUT,
            "A step waited for a response (ctx.wait_for_response) that did not come before "
            "its timeout; the request is sent again on the next attempt.",
            "yes",
            "Check that the responding system gets the request and POSTs its answer to the response URL.",
        ),
        Code(
            CHILDREN_FAILED,
            "A split message's children ended FAILED or cancelled, so the parent failed.",
            "no",
            "Look at the failed children (`openhub messages list --parent-id <id>`); restart them, then the parent.",
        ),
        Code(
            EXCEPTION,
            "A step raised an unexpected exception: the code is its class name (ValueError, KeyError). "
            "Treated as a fault of the moment unless the route or step lists it in fatal=.",
            "depends",
            "Usually a bug in the route's step: read the traceback (`openhub messages show -v`).",
        ),
    )
}


def hub_codes() -> list[Code]:
    """The hub's own entries, in catalogue order."""
    return list(CATALOGUE.values())


def is_hub_code(code: str) -> bool:
    """Whether `code` is one the hub assigns (an HTTP status's included)."""
    return code in CATALOGUE or _HTTP.match(code) is not None


def describe(code: str, declared: dict[str, Code] | None = None) -> Code | None:
    """The entry of a code found on a message: the hub's, its HTTP family's, a route's (`declared`), or
    None (an exception's class name or a code no route declares: `openhub errors` flags it)."""
    if code in CATALOGUE:
        return CATALOGUE[code]
    match = _HTTP.match(code)
    if match:
        status = int(match.group(1))
        fatal = 400 <= status < 500 and status not in RETRYABLE_4XX
        family = CATALOGUE[HTTP]
        return Code(code, family.meaning, "no" if fatal else "yes", family.action)
    return (declared or {}).get(code)
