"""What a step run came to, and the keys it is known by: pure, no I/O.

`Verdict` is how a step ended as the engine records it (and the state its external-call record
takes); `StepReport` is what the task that ran it is told; `idempotency_key` and `call_key` name a
step's call for the external system and for its call record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from openhub.core import codes
from openhub.core.context import MessageInfo, StepContext, aware, error_line
from openhub.core.errors import Reject
from openhub.core.model import RouteStep
from openhub.core.redact import redact_text
from openhub.core.states import CallState, Event

# The state an external-call record takes for each way a step can end (FAILED for the rest): a
# waiting step is OK once its response arrives, and a response timeout makes it FAILED (sent again).
CALL_STATES = {
    None: CallState.OK,
    Event.SPLIT: CallState.OK,
    Event.WAIT_RESPONSE: CallState.WAITING,
    Event.NO_EFFECT: CallState.NO_EFFECT,
    Event.POSTPONED: CallState.POSTPONED,
    Event.HELD_BACK: CallState.POSTPONED,
}

# What a step task's result says (in Flower) where the task ran no step.
SHOWN = {
    "skipped": "skipped: already done (recorded OK before, no call made)",
    "stopped": "stopped: this chain no longer carries the message (it moved on, or is another chain's)",
}

# The start of the error of a transient failure that replaced an outcome the store would not take.
UNRECORDED = "could not record the outcome of step"


@dataclass
class Verdict:
    """How a step ended, as the engine records it."""

    event: Event | None  # None: the step succeeded and the route goes on
    error: str | None = None
    delay: timedelta | None = None
    children: list[Any] = field(default_factory=list)
    code: str | None = None  # the failure's searchable error code (openhub.core.failures)
    call_state: str = ""  # what the external call did (a CallState); by default what the event implies
    against_system: bool = False  # a transient failure that counts against the step's system's breaker
    result: Any = None  # what the step returned (a sync route's last step: its result, as JSON text once checked)

    def __post_init__(self) -> None:
        self.call_state = self.call_state or CALL_STATES.get(self.event, CallState.FAILED)
        self.error = redact_text(self.error)  # stored, shown and confirmed: never the hub's own credentials

    @property
    def succeeded(self) -> bool:
        """The step did its part (the route goes on, splits or waits for its response)."""
        return self.event in (None, Event.SPLIT, Event.WAIT_RESPONSE)

    @property
    def unrecorded(self) -> bool:
        """This verdict already replaces one the store would not take."""
        return self.event is Event.TRANSIENT and bool(self.error) and str(self.error).startswith(UNRECORDED)

    def effect(self) -> str:
        """What the step's external call did, to keep on its record when the verdict itself is not written.

        A split calls nothing: its effect is its children, written with its verdict. Where that verdict
        is discarded (the lease was lost, the write failed), the split did nothing, and a later run must
        split again rather than find it done with no children.
        """
        return CallState.FAILED if self.event is Event.SPLIT or self.children else self.call_state

    def unrecordable(self, step_key: str, failure: str) -> Verdict:
        """The transient failure that replaces this verdict where the store would not take it (`failure`,
        the traceback): it still records what the step's external call did."""
        return Verdict(
            Event.TRANSIENT,
            call_state=self.effect(),
            code=codes.UNRECORDED,
            error=f"{UNRECORDED} {step_key!r}:\n{failure}",
            result=self.result,
        )

    def short(self) -> str | None:
        """The one line shown of the verdict's error."""
        return error_line(self.error)


@dataclass(frozen=True)
class StepReport:
    """What one run of a step came to, for the task that ran it (Flower shows it): true when the chain
    should go on."""

    go_on: bool
    outcome: str  # ok, skipped, stopped, or the event the hub recorded (transient, rejected, postponed, ...)
    error: str | None = None

    @property
    def failed(self) -> bool:
        """The step's attempt failed (the hub retries it or has failed the message)."""
        return self.outcome in (Event.TRANSIENT.value, Event.REJECTED.value)

    @property
    def shown(self) -> str:
        """The task's result as Flower lists it. A retry's chain starts at the route's first step, and a
        step already done is skipped: Celery calls that task a SUCCESS like any other, so its result
        says it made no call, lest an operator reading Flower suspect the call was made twice."""
        return SHOWN.get(self.outcome, self.outcome)

    def __bool__(self) -> bool:
        return self.go_on

    @classmethod
    def of(cls, verdict: Verdict, go_on: bool) -> StepReport:
        """The report of a verdict that was recorded."""
        return cls(go_on, verdict.event.value if verdict.event else "ok", verdict.short())


def idempotency_key(row: Any, item: RouteStep) -> str:
    """Stable per message and step (and per total restart), for external systems' own dedup:
    `<source system>/<correlation id>/<step>[/<generation>]`.

    A split child's correlation id is its parent's with `#<generation>.<n>` added, which a source
    system may send as its own id too: so `%`, `#` and `/` in a correlation id are escaped, and a
    child's id is followed by `#<its message id>`. Keys of ids without those characters are unchanged.
    Characters outside printable ASCII are percent-encoded too (their UTF-8 bytes, RFC 3986), so the
    key is always a valid HTTP header value: `bestellung-ü-1` is `bestellung-%C3%BC-1`.
    """
    name = _ESCAPES.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), row.correlation_id)
    if row.parent_id is not None:
        name = f"{name}#{row.id}"
    key = f"{row.source_system}/{name}/{item.key}"
    return f"{key}/{row.generation}" if row.generation else key


_ESCAPES = re.compile(r"[%#/]|[^\x20-\x7e]")


def call_key(row: Any, item: RouteStep, ctx: StepContext) -> str:
    """The external-call record a step is guarded by, by its scope."""
    if item.scope == "entity":
        if row.object_id is None:
            raise Reject(f"step {item.key!r} has entity scope but message {row.id} has no object_id")
        # Per source system: otherwise one system's message dated ahead would make another
        # system's genuine later update of the same entity obsolete (SKIPPED).
        return f"entity:{row.source_system}:{row.entity_type}:{row.object_id}:{item.key}"
    if item.scope == "custom":
        return f"custom:{item.custom_key(ctx)}:{item.key}"  # type: ignore[misc, union-attr]
    return message_call_key(row.id, item)


def message_call_key(message_id: int, item: RouteStep) -> str:
    """The external-call record of a step with message scope."""
    return f"msg:{message_id}:{item.key}"


def message_info(row: Any) -> MessageInfo:
    """What a step sees of its message."""
    return MessageInfo(
        id=row.id,
        correlation_id=row.correlation_id,
        source_system=row.source_system,
        service=row.service,
        operation=row.operation,
        object_id=row.object_id,
        entity_type=row.entity_type,
        process_id=row.process_id,
        failed_count=row.failed_count,
        received_at=cast(datetime, aware(row.received_at)),
        msg_timestamp=cast(datetime, aware(row.msg_timestamp)),
        parent_id=row.parent_id,
    )
