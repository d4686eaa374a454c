"""openhub: an asynchronous integration hub on Celery.

Define routes with `Route` and `@step`, submit messages with `submit`, run `celery -A tasks
worker` and `celery -A tasks beat`, and every message reaches the state README.md ("How it works") gives it.
"""

from importlib import import_module
from typing import Any

from .context import MessageInfo, MessageView, Outcome, StepContext
from .errors import (ConfigurationError, Holdback, InputError, NotFound, OpenHubError, PayloadTooLarge, Postpone,
                     Reject, StateConflict, StoreUnavailable, TransientError, UnknownRouteError)
from .model import Child, RetryPolicy, Route, Split, Step, step
from .registry import confirmation, on_state
from .states import State

# What needs the store (SQLAlchemy) is imported on first use, so that a route module, or anything
# importing only the routing model, loads no database library.
_LAZY = {"list_confirmations": "confirm", "cancel": "operator", "pause": "operator", "paused": "operator",
         "respond": "operator", "restart": "operator", "resume": "operator", "restart_matching": "operator",
         "cancel_matching": "operator", "get_message": "producer", "list_messages": "producer",
         "count_messages": "producer", "submit": "producer", "submit_many": "producer", "HttpCall": "http"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'openhub' has no attribute {name!r}")


__all__ = [
    "Child", "ConfigurationError", "Holdback", "HttpCall", "InputError", "MessageInfo", "MessageView", "NotFound",
    "OpenHubError", "Outcome", "PayloadTooLarge", "Postpone", "Reject", "RetryPolicy", "Route", "Split",
    "State", "StateConflict", "Step", "StepContext", "StoreUnavailable", "TransientError",
    "UnknownRouteError", "cancel", "cancel_matching", "confirmation", "count_messages", "get_message",
    "list_confirmations", "list_messages", "on_state", "pause", "paused", "respond", "restart", "restart_matching",
    "resume", "step", "submit", "submit_many",
]
