"""Back-pressure: a source system's (and a route's) messages not yet final, against their caps.

OPENHUB_BACKLOG_LIMITS (`CRM=1000`) caps a source system's, `Route(backlog_limit=)` a route's. A
submission that would take a backlog past its cap stores nothing and raises Backlogged (the HTTP
ingress answers 429 with Retry-After); the backlog drains as its messages end. Counted are the messages
a source system sent (not split children, which its messages make and which end with them) and the receivers
of its topics' messages (openhub.core.topics: they end on their own, their family is final at once), read in
the transaction that would insert: two submissions racing for the last places may both get one.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import partial
from typing import Any

from sqlalchemy import Connection, and_, exists, func, or_, select

from openhub.core.config import Settings
from openhub.core.errors import Backlogged
from openhub.core.model import route_name
from openhub.core.registry import Registry
from openhub.core.states import FINAL
from openhub.core.topics import is_topic
from openhub.store.schema import messages

M = messages.c
_FINAL = [s.value for s in FINAL]


def counted(registry: Registry) -> Any:
    """The messages a backlog counts: top-level ones, and the receivers of a topic's message."""
    topics = [route for route in registry.routes.values() if is_topic(route)]
    if not topics:
        return M.parent_id.is_(None)
    family = messages.alias("family")
    of_topic = or_(*(and_(family.c.service == t.service, family.c.operation == t.operation) for t in topics))
    return or_(M.parent_id.is_(None), exists().where(family.c.id == M.parent_id, of_topic))


def backlog(conn: Connection, registry: Registry, *where: Any, at_most: int) -> int:
    """How many top-level messages and topics' receivers matching `where` are not final yet, counting no
    further than `at_most`."""
    live = select(M.id).where(and_(counted(registry), M.state.not_in(_FINAL), *where)).limit(at_most).subquery()
    return conn.execute(select(func.count()).select_from(live)).scalar_one()


def check_backlogs(
    conn: Connection,
    rows: list[dict[str, Any]],
    settings: Settings,
    registry: Registry,
    receivers: list[dict[str, Any]] | None = None,
) -> None:
    """Backlogged if the NEW rows (and the `receivers` of the topics' messages among them, written with them)
    would take their source system's or route's backlog past its cap."""
    if not rows or rows[0]["parent_id"] is not None:  # split children: their parent was admitted
        return
    # A topic's message is final at once: what stays in the backlog is its receivers.
    rows = [r for r in rows if not is_topic(registry.route(route_name(r["service"], r["operation"])))] + (
        receivers or []
    )
    wait = max(1, math.ceil(settings.poll_interval.total_seconds()))
    backlog_ = partial(backlog, conn, registry)
    for system, adding in Counter(row["source_system"] for row in rows).items():
        cap = settings.backlog_limits.get(system)
        if cap is not None and backlog_(M.source_system == system, at_most=cap) + adding > cap:
            raise Backlogged(
                f"source system {system} has {cap} messages not yet final, its cap "
                f"(OPENHUB_BACKLOG_LIMITS): nothing stored; retry later",
                wait,
            )
    for (service, operation), adding in Counter((row["service"], row["operation"]) for row in rows).items():
        cap = registry.route(f"{service}.{operation}").backlog_limit
        if cap is not None and backlog_(M.service == service, M.operation == operation, at_most=cap) + adding > cap:
            raise Backlogged(
                f"route {service}.{operation} has {cap} messages not yet final, its backlog_limit: "
                "nothing stored; retry later",
                wait,
            )


def backlogs(conn: Connection, settings: Settings, registry: Registry) -> list[dict[str, Any]]:
    """Each capped source system's and route's backlog against its cap, for the overview."""
    shown = []
    for system, cap in sorted(settings.backlog_limits.items()):
        shown.append(
            {
                "source_system": system,
                "backlog": backlog(conn, registry, M.source_system == system, at_most=cap),
                "limit": cap,
            }
        )
    for name, route in sorted(registry.routes.items()):
        if route.backlog_limit is not None:
            shown.append(
                {
                    "route": name,
                    "limit": route.backlog_limit,
                    "backlog": backlog(
                        conn,
                        registry,
                        M.service == route.service,
                        M.operation == route.operation,
                        at_most=route.backlog_limit,
                    ),
                }
            )
    return shown
