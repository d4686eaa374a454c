"""What a step sees (StepContext) and what readers get back (MessageView)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from .errors import StepOutcome

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
        return f"{self.service}.{self.operation}"


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
        return out


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

    def __init__(self, *, payload: Any, message: MessageInfo, idempotency_key: str, attempt: int,
                 redelivered: bool, custom_data: dict[str, Any], response: Any = None) -> None:
        self.payload = payload
        self.message = message
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self.redelivered = redelivered
        self.custom_data = custom_data
        self.response = response
        self.business_errors: list[dict[str, str]] = []
        self.log = logging.LoggerAdapter(log, {"correlation_id": message.correlation_id, "message_id": message.id})

    def business_error(self, code: str, text: str) -> None:
        """Record an expected business error; the route goes on and the error is confirmed at the end."""
        self.business_errors.append({"code": str(code), "text": str(text)})

    def no_effect(self) -> None:
        """Stop here and try the message again later without counting a failure."""
        raise NoEffect("no effect")

    def wait_for_response(self, timeout: timedelta | float) -> None:
        """Stop here (this step counts as done) until `openhub.respond()` delivers a response."""
        if not isinstance(timeout, timedelta):
            timeout = timedelta(seconds=float(timeout))
        raise WaitForResponse(timeout)


@dataclass(frozen=True)
class Outcome:
    """What a confirmer receives: the message, its final state and its business errors."""

    message: MessageView
    state: str
    business_errors: list[dict[str, str]]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for sending to the source system."""
        m = self.message
        return {"id": m.id, "correlation_id": m.correlation_id, "source_system": m.source_system,
                "route": m.route, "process_id": m.process_id, "state": self.state,
                "business_errors": self.business_errors, "failed_error": first_line(m.failed_error),
                "error_code": m.error_code}


def first_line(text: str | None) -> str | None:
    """The last line of an error text (a traceback's own message), or None."""
    return text.strip().splitlines()[-1] if text else None
