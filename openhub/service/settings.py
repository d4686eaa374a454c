"""The settings in force, and an admin's changes to the live ones (`openhub config`, `/api/v1/config`).

A change is kept in the store with its audit entry (`config.set`, `config.unset`) in one transaction, and
every process applies it within one poll interval (`Hub.refresh`); the caller's own hub at once. A setting
that is read only at start-up is refused (StateConflict: it needs a restart), an unknown one is NotFound,
and a value that `Settings.from_env` would refuse is an InputError naming the setting: nothing is stored.
"""

from __future__ import annotations

import os
from datetime import timezone
from typing import Any

from openhub.core import live
from openhub.core.errors import ConfigurationError, InputError, NotFound, StateConflict
from openhub.engine.hub import Hub, given
from openhub.store import audit
from openhub.store import live as live_store


def settings_in_force(*, hub: Hub | None = None, kind: str = "this process") -> dict[str, Any]:
    """This process's settings in force with their sources (secrets masked), the live values kept in the
    store (who set them, when, why), and the newest snapshot of each process kind (api, worker, beat)."""
    hub = given(hub)
    settings = hub.refresh(force=True)
    with hub.reading() as conn:
        values = live_store.listing(conn)
        snapshots = live_store.snapshots(conn)
    for row in values:
        row["set_at"] = _iso(row["set_at"])
    for snap in snapshots:
        snap["seen_at"] = _iso(snap["seen_at"])
    return {
        "process": {"kind": kind, "settings": live.in_force(settings, os.environ)},
        "live": sorted(live.LIVE),
        "values": values,
        "processes": snapshots,
    }


def _iso(value: Any) -> str | None:
    return None if value is None else value.replace(tzinfo=value.tzinfo or timezone.utc).isoformat()


def _checked(name: str, value: str | None) -> str:
    """`name` if it is a live setting and `value` (None: an unset) parses; the refusal as the service's error."""
    name = name.strip().upper() if isinstance(name, str) else ""
    try:
        live.parse_live(name, value if value is not None else "")
    except live.UnknownSetting as exc:
        raise NotFound(str(exc)) from None
    except live.NeedsRestart as exc:
        raise StateConflict(str(exc)) from None
    except ConfigurationError as exc:
        if value is not None:
            raise InputError(str(exc)) from None
    return name


def _reason(reason: str | None) -> str | None:
    if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
        raise InputError("a reason is text of at most 500 characters")
    return reason.strip() or None if reason else None


def set_setting(name: str, value: str, reason: str | None = None, *, hub: Hub | None = None) -> dict[str, Any]:
    """Keep a live value for `name`: every process uses it within one poll interval; audited."""
    hub = given(hub)
    if not isinstance(value, str):
        raise InputError(f"{name}: the value is text, as the environment variable would hold it")
    value = value.strip()
    name, reason = _checked(name, value), _reason(reason)
    with hub.transaction() as conn:
        now = hub.clock()
        old = live_store.stored(conn, name)
        live_store.put(conn, name, value, audit.current_actor().name[:100], reason, now)
        audit.record(
            conn, "config.set", target=name, old=old and old["value"], new={"value": value, "reason": reason}, now=now
        )
    hub.refresh(force=True)
    return {"name": name, "value": value, "source": "store", "previous": old and old["value"], "reason": reason}


def unset_setting(name: str, reason: str | None = None, *, hub: Hub | None = None) -> dict[str, Any]:
    """Forget the live value of `name`: its environment's value or its default applies again within one poll
    interval; audited. NotFound when none is kept."""
    hub = given(hub)
    name, reason = _checked(name, None), _reason(reason)
    with hub.transaction() as conn:
        old = live_store.stored(conn, name)
        if old is None:
            raise NotFound(f"{name} has no live value: it is the environment's or its default")
        live_store.remove(conn, name)
        audit.record(conn, "config.unset", target=name, old=old["value"], new={"value": None, "reason": reason})
    settings = hub.refresh(force=True)
    row = next(r for r in live.in_force(settings, os.environ) if r["name"] == name)
    return {"name": name, "value": row["value"], "source": row["source"], "previous": old["value"]}
