"""openhub: an asynchronous integration hub on Celery.

Define routes with `Route` and `@step`, submit messages with `submit`, run `celery -A tasks
worker` and `celery -A tasks beat`, and every message reaches the state README.md ("How it works") gives it.
"""

from importlib import import_module
from typing import Any

from openhub.core.context import MessageInfo, MessageView, Outcome, StepContext
from openhub.core.errors import (
    ConfigurationError,
    Holdback,
    InputError,
    NotFound,
    OpenHubError,
    PayloadTooLarge,
    Postpone,
    Reject,
    StateConflict,
    StoreUnavailable,
    TransientError,
    UnknownRouteError,
)
from openhub.core.model import Child, RetryPolicy, Route, Soap, Split, Step, step
from openhub.core.registry import confirmation, on_state
from openhub.core.states import State
from openhub.core.topics import Topic

# What needs the store (SQLAlchemy) is imported on first use, so that a route module, or anything
# importing only the routing model, loads no database library.
_LAZY = {
    "list_confirmations": "service.confirmations",
    "cancel": "service.actions",
    "pause": "service.pauses",
    "paused": "service.pauses",
    "respond": "service.actions",
    "restart": "service.actions",
    "restart_from": "service.actions",
    "retry_now": "service.actions",
    "edit_payload": "service.actions",
    "resume": "service.pauses",
    "restart_matching": "service.actions",
    "cancel_matching": "service.actions",
    "get_message": "service.reads",
    "list_messages": "service.reads",
    "count_messages": "service.reads",
    "submit": "service.messages",
    "submit_many": "service.messages",
    "HttpCall": "outbound.http",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'openhub' has no attribute {name!r}")


__all__ = [
    "Child",
    "ConfigurationError",
    "Holdback",
    "HttpCall",
    "InputError",
    "MessageInfo",
    "MessageView",
    "NotFound",
    "OpenHubError",
    "Outcome",
    "PayloadTooLarge",
    "Postpone",
    "Reject",
    "RetryPolicy",
    "Route",
    "Soap",
    "Split",
    "State",
    "StateConflict",
    "Step",
    "StepContext",
    "StoreUnavailable",
    "Topic",
    "TransientError",
    "UnknownRouteError",
    "cancel",
    "cancel_matching",
    "confirmation",
    "count_messages",
    "get_message",
    "list_confirmations",
    "list_messages",
    "on_state",
    "pause",
    "paused",
    "respond",
    "restart",
    "restart_matching",
    "restart_from",
    "retry_now",
    "edit_payload",
    "resume",
    "step",
    "submit",
    "submit_many",
]
