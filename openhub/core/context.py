"""What a step sees (StepContext) and what readers get back (MessageView)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, overload
from urllib.parse import urlencode

from openhub.core.errors import StepOutcome
from openhub.core.model import route_name

if TYPE_CHECKING:
    from openhub.core.config import Settings

log = logging.getLogger("openhub.step")


@dataclass(frozen=True)
class MessageInfo:
    """Read-only facts about a message, as a step sees them."""

    id: int
    correlation_id: str
    source_system: str
    service: str
    operation: str
    object_id: str | None
    entity_type: str | None
    process_id: str | None
    failed_count: int
    received_at: datetime
    msg_timestamp: datetime
    parent_id: int | None

    @property
    def route(self) -> str:
        """`service.operation`."""
        return route_name(self.service, self.operation)


@dataclass(frozen=True)
class ExtCallView:
    """One guarded external call of a message: its key, state and attempt count."""

    key: str
    step: str
    state: str
    attempts: int


@dataclass(frozen=True)
class MessageView(MessageInfo):
    """A message as the store holds it, with its outcome so far."""

    state: str
    payload: Any
    funnel: str | None
    business_errors: list[dict[str, str]]
    custom_data: dict[str, Any]
    failed_step: str | None
    failed_error: str | None
    finished_at: datetime | None
    error_code: str | None = None  # the last failure's searchable code
    expires_at: datetime | None = None  # not started after this, it ends FAILED with error code EXPIRED
    ext_calls: list[ExtCallView] = field(default_factory=list)
    duplicate: bool = False
    traceparent: str | None = None  # the W3C trace context its spans continue (openhub.core.tracing)
    result: Any = None  # a synchronous route's result: its last step's return value (Route(sync=True))
    priority: int = 4  # 0-9, higher = sooner (README.md, "Priority")

    @property
    def trace_id(self) -> str | None:
        """The id of the message's trace (32 hex digits), None when it has none."""
        return self.traceparent[3:35] if self.traceparent else None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps as ISO 8601 UTC)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif name == "ext_calls":
                value = [vars(c) for c in value]
            out[name] = value
        out["route"] = self.route
        out["trace_id"] = self.trace_id
        return out


@overload
def aware(value: datetime) -> datetime: ...
@overload
def aware(value: None) -> None: ...
def aware(value: datetime | None) -> datetime | None:
    """Mark a naive UTC timestamp from the store as UTC."""
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


class NoEffect(StepOutcome):
    """Raised by `ctx.no_effect()`: try again later without counting a failure."""


class WaitForResponse(StepOutcome):
    """Raised by `ctx.wait_for_response()`: park the message until a response arrives."""

    def __init__(self, timeout: timedelta) -> None:
        super().__init__(f"waiting for a response (timeout {timeout})")
        self.timeout = timeout


class StepContext:
    """Everything a step needs: the payload, the message, its idempotency key and outcome calls."""

    def __init__(
        self,
        *,
        payload: Any,
        message: MessageInfo,
        idempotency_key: str,
        attempt: int,
        redelivered: bool,
        custom_data: dict[str, Any],
        response: Any = None,
        wait_token: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.payload = payload
        self.message = message
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self.redelivered = redelivered
        self.custom_data = custom_data
        self.response = response
        # This run's ask: a step that waits hands it to the responder, who sends it back with the answer
        # (openhub.respond(..., token=), `?token=` over HTTP); new for every run of the step.
        self.wait_token = wait_token
        # The settings of the hub running the step: its HTTP exchanges are recorded in that hub's store, as
        # its settings say (openhub.outbound.http); None: a context built outside a hub's run records none.
        self.settings = settings
        self.business_errors: list[dict[str, str]] = []
        self.log = logging.LoggerAdapter(log, {"correlation_id": message.correlation_id, "message_id": message.id})

    def check_fence(self) -> None:
        """Call right before an external call the step makes with its own client (HttpCall does it for
        its calls): raises Fenced where this process's heartbeat fell behind (a stall, the store away),
        when others may judge it dead and make the call again. Not a failure: let it propagate, the
        step's lease is let go and the step runs later (openhub.store.workers.check_fence)."""
        from openhub.store.workers import check_fence

        check_fence()

    def business_error(self, code: str, text: str) -> None:
        """Record an expected business error; the route goes on and the error is confirmed at the end."""
        self.business_errors.append({"code": str(code), "text": str(text)})

    def no_effect(self) -> None:
        """Stop here and try the message again later without counting a failure."""
        raise NoEffect("no effect")

    def response_url(self, base_url: str) -> str:
        """Where the responder POSTs the answer to this step's question: the hub's API at `base_url`
        (e.g. `https://hub.example.com`), this message's response endpoint, this run's `wait_token`."""
        query = urlencode({"token": self.wait_token})
        return f"{base_url.rstrip('/')}/api/v1/messages/{self.message.id}:response?{query}"

    def wait_for_response(self, timeout: timedelta | float) -> None:
        """Stop here (this step counts as done) until `openhub.respond()` delivers a response for this
        run's `wait_token` (or, without a token, as README says where that is enough)."""
        if not isinstance(timeout, timedelta):
            timeout = timedelta(seconds=float(timeout))
        raise WaitForResponse(timeout)


@dataclass(frozen=True)
class Outcome:
    """What a confirmer receives: the message, its final state and its business errors."""

    message: MessageView
    state: str
    business_errors: list[dict[str, str]]
    # This notification of this transition: the same on every retry of it, another for the next
    # transition of the message (a restarted message failing again), so a receiver can dedup by it.
    delivery_id: int | None = None
    # The same, random: what the stock webhook sends as `webhook-id` (nobody can guess it ahead).
    delivery_key: str | None = None
    # The state hook this notification is for; None: the confirmation to the message's source system.
    hook: str | None = None
    # The settings in force of the hub sending it: the stock webhook and confirmer sign it with that hub's
    # secrets and give it that hub's OPENHUB_CONFIRM_TIMEOUT (None: an Outcome built elsewhere, which they refuse).
    settings: Settings | None = field(default=None, repr=False, compare=False)

    @property
    def webhook_id(self) -> str:
        """The notification's id for its receiver (`webhook-id`, `Idempotency-Key`): the same on every
        retry, unguessable (`delivery_key`); a row from before it had one keeps the old counted form."""
        if self.delivery_key:
            return f"openhub_{self.delivery_key}"
        return f"openhub:{self.message.id}:{self.state}:{self.delivery_id}"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for sending to the source system."""
        m = self.message
        return {
            "id": m.id,
            "correlation_id": m.correlation_id,
            "source_system": m.source_system,
            "route": m.route,
            "process_id": m.process_id,
            "state": self.state,
            "business_errors": self.business_errors,
            "failed_error": error_line(m.failed_error),
            "error_code": m.error_code,
        }


ERROR_LINE_CHARS = 500
# httpx's raise_for_status() text: "Server error '503 Service Unavailable' for url '...'", then a line
# sending the reader to developer.mozilla.org, the line a list would otherwise have shown.
_HTTPX_STATUS = re.compile(
    r"^(?:httpx\.HTTPStatusError: )?(?:Informational response|Redirect response|"
    r"Client error|Server error|Invalid status code) '(\d{3})[^']*' for url '(.+)'$"
)
# openhub.outbound.http.HttpCall's texts, carried by a TransientError or a Reject: "POST <url> answered 503: <body>"
# (a Reject's followed by " [HTTP_422]", a postponement's by ", Retry-After 5"), and "POST <url>: ConnectError:
# <what httpx said>" where no answer came.
_OWN_MODULE = r"openhub\.(?:core\.)?errors\."  # rows stored before the floors say openhub.errors.
_OWN_CLASS = re.compile(rf"^(?:{_OWN_MODULE})?(?:TransientError|Reject): ")
_HTTP_ANSWER = re.compile(r"^([A-Z]+) (\S+) answered (\d{3})(.*?)(?: \[HTTP_\d{3}\])?$")
_HTTP_NO_ANSWER = re.compile(r"^([A-Z]+) (\S+): ([A-Z]\w*): (.*)$")


def error_line(text: str | None, limit: int = ERROR_LINE_CHARS) -> str | None:
    """The one line shown of a stored error text (None when there is none), at most `limit` characters.

    Every place that shows an error shows this line (the message list and detail, the Failed tab, the
    overview's parked confirmations, the confirmations list, the CLI, history details, what a source
    system is told); the whole text is a click away on the admin page (`--verbose` in the CLI, the
    `failed_error` and `last_error` of `GET /api/v1/messages/{id}` with the admin token). The line:
    - of a traceback, the exception that ended it (its first line: `KeyError: 'id'`);
    - of an HTTP status, `HTTP 503 from POST <url>: <the start of the body>` (from `HttpCall`), or
      `HTTP 503 from <url>` (httpx's `raise_for_status()`, whose text has no method);
    - of an HTTP call that got no answer, `ConnectError on POST <url>: <what httpx said>`;
    - of any other text, its first line; `openhub.core.errors.` (stored before the
      floors, `openhub.errors.`) is left out of the hub's own exceptions' names.
    """
    lines = [line.rstrip() for line in (text or "").strip().splitlines()]
    if not lines:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts:  # frames are indented; the first line back at the margin is the exception
        line = next((x for x in lines[starts[-1] + 1 :] if x and not x[0].isspace()), lines[-1])
    else:
        line = next(x for x in lines if x.strip())
    line = _said_usefully(line.strip())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _said_usefully(line: str) -> str:
    status = _HTTPX_STATUS.match(line)
    if status:
        return f"HTTP {status[1]} from {status[2]}"
    own = _OWN_CLASS.match(line)
    said = line[own.end() :] if own else line  # a postponement's reason comes without the class
    answer = _HTTP_ANSWER.match(said)
    if answer:
        return f"HTTP {answer[3]} from {answer[1]} {answer[2]}{answer[4]}"
    failed = _HTTP_NO_ANSWER.match(said) if own else None
    if failed:
        return f"{failed[3]} on {failed[1]} {failed[2]}: {failed[4]}"
    return re.sub(f"^{_OWN_MODULE}", "", line)
