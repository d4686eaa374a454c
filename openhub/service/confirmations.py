"""The operators' calls on confirmations (`openhub.list_confirmations`, `resend`, `resend_parked`): by the hub
given, else the process's (`given`), whose settings and routes openhub.outbound.confirm is handed."""

from __future__ import annotations

from typing import Any

from openhub.engine.hub import Hub, given
from openhub.outbound import confirm


def list_confirmations(
    state: str | None = None,
    message_id: int | None = None,
    source_system: str | None = None,
    limit: int = 100,
    *,
    hub: Hub | None = None,
) -> list[dict[str, Any]]:
    """Confirmations with their message's source system and correlation id, newest first, in the hub's store;
    `state="FAILED_END"` lists the parked ones for operators."""
    return confirm.list_confirmations(state, message_id, source_system, limit, settings=given(hub).settings)


def resend(confirmation_id: int, *, hub: Hub | None = None) -> dict[str, Any]:
    """Send a parked (FAILED_END) confirmation again now, with a fresh round of attempts; the row after."""
    hub = given(hub)
    return confirm.resend(confirmation_id, settings=hub.settings, registry=hub.registry)


def resend_parked(source_system: str | None = None, *, hub: Hub | None = None) -> list[int]:
    """Make every parked confirmation (of one source system) due again; the poller sends them. Their ids."""
    return confirm.resend_parked(source_system, settings=given(hub).settings)
