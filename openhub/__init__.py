"""openhub: an asynchronous integration hub on Celery.

Define routes with `Route` and `@step`, submit messages with `submit`, run `celery -A tasks
worker` and `celery -A tasks beat`, and every message reaches the state DESIGN.md §3 gives it.
"""

from .confirm import Outcome, list_confirmations
from .context import MessageInfo, MessageView, StepContext
from .errors import (ConfigurationError, Holdback, InputError, NotFound, OpenHubError, PayloadTooLarge, Postpone,
                     Reject, StateConflict, StoreUnavailable, TransientError, UnknownRouteError)
from .model import Child, RetryPolicy, Route, Split, Step, step
from .operator import cancel, pause, paused, respond, restart, resume
from .producer import get_message, list_messages, submit, submit_many
from .registry import confirmation
from .states import State

__all__ = [
    "Child", "ConfigurationError", "Holdback", "InputError", "MessageInfo", "MessageView", "NotFound",
    "OpenHubError", "Outcome", "PayloadTooLarge", "Postpone", "Reject", "RetryPolicy", "Route", "Split",
    "State", "StateConflict", "Step", "StepContext", "StoreUnavailable", "TransientError",
    "UnknownRouteError", "cancel", "confirmation", "get_message", "list_confirmations", "list_messages",
    "pause", "paused", "respond", "restart", "resume", "step", "submit", "submit_many",
]
