"""Fan-out (publish/subscribe): a `Topic` that routes subscribe to with `Route(..., subscribes=...)`.

One message accepted for a topic is a *family*: the topic's own message (the one the source system sent,
its id the answer's) and one *receiver* per subscribed route, a message of that route with its own state,
retries, confirmation and history. The receivers are written in the accept transaction
(openhub.engine.fanout), so none exists if it rolls back, and the subscribers are those of that moment: a
route subscribed later receives only later messages.

A family is modelled as a parent with unbound split children (`Split(bound=False)`): each receiver names
the family as its `parent_id` and is neither held, failed, cancelled nor restarted with it or its
siblings; the topic's message itself has no step to run and is OK from its accept on. So the admin page,
`GET /api/v1/messages/{id}` (`children`) and `list_messages(parent_id=)` show a family as they show a
split's, and each receiver's end is confirmed to the source system (`confirm_children`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from openhub.core.errors import ConfigurationError, Reject
from openhub.core.model import Route, Split

if TYPE_CHECKING:
    from openhub.core.context import StepContext

FAN_OUT = "fan_out"  # the key of a topic's one step (its receivers, written at accept)
# What a topic's message may say about itself: who may publish, how its payload is checked and shown, its
# entity and expiry (which its receivers inherit). What a message does is its receivers' routes' business.
_TOPIC_OPTIONS = {"sources", "validate", "secret_fields", "object_id", "entity_type", "expires_after"}


def _written_at_accept(ctx: StepContext) -> list[Any]:
    # Never run: a family is OK from its accept, and the hub does not restart it (openhub.service.actions).
    raise Reject("a fan-out family's receivers were written when it was accepted: restart a receiver instead")


@dataclass(frozen=True, init=False)
class Topic(Route):
    """A message type several routes subscribe to (`Route(..., subscribes="order.created")`): each accepted
    message becomes one message per subscribed route. Named and submitted as a route is
    (`service.operation`, `POST /api/v1/messages/{service}/{operation}`); options: `sources`, `validate`,
    `secret_fields`, `object_id`, `entity_type`, `expires_after`."""

    def __init__(self, name: str, **options: Any) -> None:
        unknown = set(options) - _TOPIC_OPTIONS
        if unknown:
            raise ConfigurationError(f"topic {name!r}: unknown option(s) {', '.join(sorted(unknown))}")
        fan_out = Split(_written_at_accept, key=FAN_OUT, bound=False, confirm_children=True)
        super().__init__(name, steps=[fan_out], **options)


def is_topic(route: Route | None) -> bool:
    """Whether `route` is a topic (its messages are fan-out families)."""
    return isinstance(route, Topic)


def subscribers(routes: Mapping[str, Route], topic: str) -> list[Route]:
    """The routes subscribed to `topic`, by name: the order of a family's receivers."""
    return sorted((r for r in routes.values() if topic in r.subscribes), key=lambda r: r.name)


def check_subscriptions(routes: Mapping[str, Route]) -> None:
    """ConfigurationError for a route subscribed to something that is not a loaded topic."""
    for route in routes.values():
        for name in route.subscribes:
            if not is_topic(routes.get(name)):
                what = "a route, not a Topic" if name in routes else "unknown"
                raise ConfigurationError(f"route {route.name!r} subscribes to {name!r}, which is {what}")
