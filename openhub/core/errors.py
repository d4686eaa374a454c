"""Every error openhub raises, in one place.

    OpenHubError
    ├── ConfigurationError      a route, step or setting is malformed (raised at load time)
    ├── InputError              a message cannot be accepted (nothing was stored)
    │   ├── UnknownRouteError   no route has that name
    │   └── PayloadTooLarge     payload over OPENHUB_MAX_PAYLOAD_BYTES
    ├── NotFound                no message with that id
    ├── StateConflict           an operator action the message's state does not allow
    │   ├── StaleResponse       an answer for a wait that has ended (or never was): not taken
    │   └── ResponseTokenNeeded an answer without its wait's token where it could be taken for another
    ├── StoreUnavailable        the database cannot be reached (nothing was stored)
    ├── Draining                the hub is draining: it takes no new messages (nothing was stored)
    └── WebhookSignatureError   a received webhook's signature is missing, stale or wrong (for receivers)

Step outcomes are exceptions a step raises to tell the hub what happened:

    StepOutcome
    ├── Reject                  refuse the message for good: FAILED, no retry (dead letter)
    ├── Postpone                try again after a delay without counting a failure
    ├── Holdback                postpone and pause the whole route until an operator resumes it
    └── TransientError          a temporary fault: retried later, counts a failure

Any other exception raised by a step is treated as transient too (a bug to retry, not a verdict).

Between the Celery tasks (tasks/) and the engine, never answered by the API:

    Interrupted                 a time limit stopped the work where it stood (Celery's soft time limit,
                                as tasks/exceptions.py translates it)
    StepFailed                  a step's attempt failed and the hub recorded it (a task raises it for Flower)
"""

from __future__ import annotations

from datetime import timedelta


class OpenHubError(Exception):
    """Base class of every error openhub raises on purpose."""


class ConfigurationError(OpenHubError):
    """A route, step, confirmation or setting is malformed; raised when it is loaded."""


class InputError(OpenHubError, ValueError):
    """A message cannot be accepted as given; nothing was stored."""


class UnknownRouteError(InputError):
    """No route is registered under the given `service.operation` name."""


class SourceNotAllowed(InputError):
    """The route does not take messages from this source system (its `sources=`)."""


class PayloadTooLarge(InputError):
    """The serialised payload is larger than OPENHUB_MAX_PAYLOAD_BYTES."""


class NotFound(OpenHubError, LookupError):
    """No message (or route) with the given identifier exists."""


class StateConflict(OpenHubError):
    """The requested operator action is not allowed in the message's current state."""


class StaleResponse(StateConflict):
    """An answer whose token names no open wait of the message: that ask timed out, the message was
    cancelled or restarted, or no step ever gave that token. The answer is not taken (noted in the history)."""


class ResponseTokenNeeded(StateConflict):
    """An answer without a token where it could be taken for the wrong wait: the question is still being
    asked, or an earlier wait of the message was answered. Send it with its wait's token (`ctx.wait_token`)."""


class StoreUnavailable(OpenHubError):
    """The message store cannot be reached; the operation had no effect."""


class Draining(OpenHubError):
    """An operator is draining the hub (`openhub drain`): new messages are refused until it ends."""


class Backlogged(OpenHubError):
    """A source system's (or a route's) messages not yet final are at their cap (OPENHUB_BACKLOG_LIMITS,
    `Route(backlog_limit=)`): nothing was stored; submit again after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Interrupted(Exception):
    """A time limit stopped the work where it stood: what a driver's own limit (Celery's
    SoftTimeLimitExceeded) is read as, at the boundary (tasks/exceptions.py)."""


class Fenced(Exception):
    """An external call refused: this process's heartbeat fell behind (a stall, the store unreachable), so
    others may judge it dead and make the call themselves (openhub.store.workers.check_fence). Not a step's
    failure: the step's lease is let go and the step runs again later."""


class StepFailed(Exception):
    """The step's attempt failed and the hub recorded it (retried later, or the message FAILED).

    Raised by a step task after the outcome is safely written, only so that Flower shows the task as failed.
    """


class WebhookSignatureError(OpenHubError, ValueError):
    """A received webhook is not signed, was signed too long ago, or no signature matches its body
    under the receiver's secrets (`openhub.outbound.notify.verify_signature`)."""


class StepOutcome(Exception):
    """Base of the exceptions a step raises to choose the message's outcome."""


class Reject(StepOutcome):
    """Refuse the message for good (validation or business refusal, poison message): FAILED."""

    def __init__(self, reason: str = "rejected", code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class Postpone(StepOutcome):
    """Try the message again after `delay` (default OPENHUB_POSTPONE_INTERVAL); no failure counted."""

    def __init__(self, delay: timedelta | float | None = None, reason: str = "postponed") -> None:
        super().__init__(reason)
        if isinstance(delay, (int, float)):
            delay = timedelta(seconds=delay)
        self.delay = delay
        self.reason = reason


class Holdback(StepOutcome):
    """Postpone the message and pause its route until an operator resumes it."""

    def __init__(self, reason: str = "held back") -> None:
        super().__init__(reason)
        self.reason = reason


class TransientError(StepOutcome):
    """A temporary fault (the external system is down, a timeout): retry later, count a failure."""
