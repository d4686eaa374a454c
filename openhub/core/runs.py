"""What travels with one step run: the step a chain carries a message through, and the run once entered.

A `StepRun` names the step (route and index), the message and the chain's fencing token, the hub it
runs in (settings, clock), and how the task runs it (redelivered by the broker, the step's own time
limit, how the driver's foreign exceptions read); the engine passes it whole instead of its parts.
`Entered` is the run once its lease is ours. Pure data: no I/O here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from openhub.core.context import StepContext
from openhub.core.model import Route, RouteStep

if TYPE_CHECKING:
    from openhub.engine.hub import Hub

# How a step's own time limit is kept where the task's limit covers more than the step (a fused
# task): given the step's timeout in seconds, a context that interrupts the step when it runs over.
TimeLimit = Callable[[float], ContextManager[Any]]


def _as_is(exc: BaseException) -> BaseException:
    return exc


@dataclass(frozen=True)
class StepRun:
    """Step `index` of `route`, carried for message `message_id` by the chain holding fencing `token`."""

    route: Route
    index: int
    message_id: int
    token: str
    hub: Hub  # the settings and clock it runs with (openhub.engine.hub)
    redelivered: bool = False
    limit: TimeLimit | None = None  # the step's own time limit, where the task's covers more (fused)
    # The driver's translation of its framework's exceptions into openhub's own (tasks/: Celery's).
    translate: Callable[[BaseException], BaseException] = _as_is

    @property
    def clock(self) -> Callable[[], datetime]:
        """The hub's clock (LocalHub moves it)."""
        return self.hub.clock

    @property
    def item(self) -> RouteStep:
        return self.route.steps[self.index]

    @property
    def last(self) -> bool:
        """This is the route's last step."""
        return self.index == len(self.route.steps) - 1

    def next(self) -> StepRun:
        """The run of the route's next step, for the same message and chain."""
        return StepRun(
            self.route,
            self.index + 1,
            self.message_id,
            self.token,
            self.hub,
            self.redelivered,
            self.limit,
            self.translate,
        )


@dataclass
class Entered:
    """A step that may run: the lease is ours and its context is ready."""

    run_id: str
    key: str
    ctx: StepContext
    row: SimpleNamespace
    started: float = field(default_factory=time.monotonic)  # its lease taken (what `workers.fenced` judges)
    call_ms: int | None = None  # how long the step itself took, once it ran (a batch's member waits around it)
    custom_data: str | None = None  # ctx.custom_data as stored, once the step has run
    # The step's call record as this run found it (None: this run's entry inserted it): its last success,
    # kept unless this run succeeds, and what the record goes back to where the run made no call.
    call_before: Any = None

    @property
    def call_ok_id(self) -> int | None:
        """The record's last success before this run (kept unless this run succeeds)."""
        return None if self.call_before is None else self.call_before.ok_message_id

    @property
    def call_ok_ts(self) -> datetime | None:
        return None if self.call_before is None else self.call_before.ok_msg_timestamp

    def duration_ms(self) -> int:
        """Milliseconds the step took (since the run was entered, before it ran)."""
        return self.call_ms if self.call_ms is not None else int((time.monotonic() - self.started) * 1000)
