"""The operators' hand on the external systems' circuit breakers (openhub.outbound.breaker keeps them): list
them, close one, or force one open for a while; each change audited with its reason."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from openhub.core.errors import InputError, NotFound
from openhub.engine.hub import Hub, given
from openhub.outbound import breaker
from openhub.store import audit


def _systems(hub: Hub) -> list[str]:
    """The external systems the hub's steps call (`@step(system=...)`), by name."""
    return sorted(
        {
            system
            for route in hub.registry.routes.values()
            for item in route.steps
            if (system := getattr(item, "system", None))
        }
    )


def _system(hub: Hub, name: str) -> str:
    known = _systems(hub)
    if name not in known:
        raise NotFound(f"no step calls a system named {name!r}; the systems are {', '.join(known) or 'none'}")
    return name


def breakers(*, hub: Hub | None = None) -> list[dict[str, Any]]:
    """Every external system a step calls (`@step(system=...)`) with its breaker as it stands."""
    hub = given(hub)
    names = _systems(hub)
    with hub.transaction() as conn:
        now = hub.clock()
        return [breaker.state(conn, name, now) for name in names]


def reset_breaker(system: str, reason: str, *, hub: Hub | None = None) -> dict[str, Any]:
    """Close a system's breaker (its failure count to 0): the steps it postponed call the system when next due."""
    return _set_breaker(given(hub), system, None, reason, "breaker.reset")


def open_breaker(system: str, reason: str, seconds: float | None = None, *, hub: Hub | None = None) -> dict[str, Any]:
    """Force a system's breaker open for `seconds` (default OPENHUB_BREAKER_OPEN): its steps are postponed
    without counting a failure; then one step tries, as after an outage."""
    hub = given(hub)
    duration = timedelta(seconds=seconds) if seconds is not None else hub.settings.breaker_open
    if duration.total_seconds() <= 0:
        raise InputError("seconds must be more than 0")
    return _set_breaker(hub, system, duration, reason, "breaker.open")


def _set_breaker(hub: Hub, system: str, duration: timedelta | None, reason: str, action: str) -> dict[str, Any]:
    _system(hub, system)
    if not isinstance(reason, str) or not reason.strip():
        raise InputError("give a reason: it is kept in the audit trail")
    with hub.transaction() as conn:
        now = hub.clock()
        old = breaker.state(conn, system, now)
        breaker.set_open_until(
            conn, system, None if duration is None else now + duration, None if duration is None else reason, now
        )
        new = breaker.state(conn, system, now)
        audit.record(conn, action, target=f"system {system}", old=old, new={**new, "because": reason}, now=now)
    return new
