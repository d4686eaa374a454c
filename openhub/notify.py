"""The stock state hook: a webhook (OPENHUB_WEBHOOK_URL) told of every message entering one of
OPENHUB_WEBHOOK_STATES (default FAILED), with the message as JSON. A refused or failed POST is
retried like a confirmation, then parked for an operator."""

from __future__ import annotations

from typing import Callable

import httpx

from .context import Outcome

TIMEOUT = 10.0


def webhook(url: str) -> Callable[[Outcome], None]:
    """A state hook that POSTs `outcome.as_dict()` to `url`; anything but a 2xx answer is a failure."""
    def notify(outcome: Outcome) -> None:
        # One key per transition, kept across retries: a message FAILED twice (restarted between) is two events.
        key = f"openhub:{outcome.message.id}:{outcome.state}:{outcome.delivery_id}"
        httpx.post(url, json=outcome.as_dict(), timeout=TIMEOUT, headers={"Idempotency-Key": key}).raise_for_status()
    notify.__qualname__ = notify.__name__ = "webhook"
    return notify
