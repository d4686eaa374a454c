"""The store's side of live configuration (openhub.core.live): the values admins set, read by every process
within one poll interval (`Hub.refresh`), and each process kind's newest snapshot of its settings in force.

The values are the one table every process reads that often: one small SELECT, at most every half poll
interval per process. A snapshot is written when a process first loads its settings or they change, so
`openhub config` can show what is in force on the API, the workers and beat without asking them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update

from openhub.store.schema import live_settings, settings_snapshots

L = live_settings.c
S = settings_snapshots.c


def overrides(conn: Connection) -> dict[str, str]:
    """Every live value by its setting's name."""
    return {r.name: r.value for r in conn.execute(select(L.name, L.value))}


def stored(conn: Connection, name: str) -> dict[str, Any] | None:
    """One live value with who set it, when and why (None: not set)."""
    row = conn.execute(select(live_settings).where(L.name == name)).first()
    if row is None:
        return None
    return {"value": row.value, "set_at": row.set_at, "set_by": row.set_by, "reason": row.reason}


def listing(conn: Connection) -> list[dict[str, Any]]:
    """Every live value with who set it, when and why, by name."""
    return [
        {"name": r.name, "value": r.value, "set_at": r.set_at, "set_by": r.set_by, "reason": r.reason}
        for r in conn.execute(select(live_settings).order_by(L.name))
    ]


def put(conn: Connection, name: str, value: str, by: str, reason: str | None, now: datetime) -> None:
    """Keep `value` for the setting `name` (replacing the one kept)."""
    values = {"value": value, "set_at": now, "set_by": by, "reason": reason}
    if not conn.execute(update(live_settings).where(L.name == name).values(**values)).rowcount:
        conn.execute(live_settings.insert().values(name=name, **values))


def remove(conn: Connection, name: str) -> bool:
    """Forget the live value of `name` (the environment's or the default applies again); whether there was one."""
    return conn.execute(delete(live_settings).where(L.name == name)).rowcount > 0


def snapshot(conn: Connection, kind: str, node: str, settings: list[dict[str, Any]], now: datetime) -> None:
    """Keep `settings` (secrets masked already) as the newest in force on a process of `kind`."""
    conn.execute(delete(settings_snapshots).where(S.kind == kind))
    conn.execute(settings_snapshots.insert().values(kind=kind, node=node, settings=json.dumps(settings), seen_at=now))


def snapshots(conn: Connection) -> list[dict[str, Any]]:
    """The newest snapshot of each process kind."""
    return [
        {"kind": r.kind, "node": r.node, "seen_at": r.seen_at, "settings": json.loads(r.settings)}
        for r in conn.execute(select(settings_snapshots).order_by(S.kind))
    ]
