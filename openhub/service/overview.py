"""What an operator asks first, answered by a handful of indexed read queries (GET /api/v1/overview,
`openhub status`).

- messages by route and state: non-final states in full (`ix_messages_live`, over live rows only), final
  states for those finished in the last day (`ix_messages_finished`); counting every OK message
  ever kept would grow with the table;
- messages finished per minute and the failure rate over the last hour (per minute) and day (per
  quarter hour), from one GROUP BY over the finished-at index;
- the oldest non-final message per route and state, with its id: the oldest time comes from the
  live-rows GROUP BY, the id from an exact (state, received_at) index lookup per group;
- confirmations not (yet) OK, by state, and the parked ones (FAILED_END);
- paused routes.

Workers are not read here: asking Celery takes the whole ping timeout, so `workers()` is separate
and callers refresh it less often. Timestamps are naive UTC in, ISO 8601 UTC out; `now` is passed in.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, func, select, text

from openhub.core.context import aware, error_line
from openhub.core.model import route_name
from openhub.core.states import FINAL, ConfirmationState, State
from openhub.engine.backlog import backlogs
from openhub.engine.hub import Hub, given
from openhub.outbound.breaker import open_breakers
from openhub.store.db import is_postgres
from openhub.store.queries import DRAIN, drain_reason
from openhub.store.queries import paused_routes as holding
from openhub.store.schema import LIVE_PREDICATE, confirmations, messages, route_pauses

HOUR_BUCKET = timedelta(minutes=1)
DAY_BUCKET = timedelta(minutes=15)
PARKED_LISTED = 20  # parked confirmations listed by id; the count covers them all
_FINAL = [s.value for s in FINAL]


def _iso(value: datetime | None) -> str | None:
    value = aware(value)
    return value.isoformat() if value is not None else None


def _minute(conn: Connection, column: Any) -> Any:
    """`column` cut to the minute by the database (the charts' bucket key; cheaper than epoch arithmetic)."""
    if is_postgres(conn):
        return func.date_trunc("minute", column)
    return func.strftime("%Y-%m-%d %H:%M:00", column)  # SQLite keeps timestamps as ISO text


def route_states(conn: Connection, now: datetime) -> list[dict[str, Any]]:
    """Per route and state: how many, and for non-final states the oldest message (id, received, age)."""
    M = messages.c
    live = (
        select(M.service, M.operation, M.state, func.count().label("count"), func.min(M.received_at).label("oldest"))
        .where(text(LIVE_PREDICATE))
        .group_by(M.service, M.operation, M.state)
        .subquery()
    )
    rows: list[dict[str, Any]] = []
    # Each group's oldest id by an exact lookup on (state, received_at): no second pass over live rows.
    for r in conn.execute(
        select(live.c.service, live.c.operation, live.c.state, live.c.count, live.c.oldest, func.min(M.id).label("id"))
        .join(
            messages,
            and_(
                M.state == live.c.state,
                M.received_at == live.c.oldest,
                M.service == live.c.service,
                M.operation == live.c.operation,
            ),
        )
        .group_by(live.c.service, live.c.operation, live.c.state, live.c.count, live.c.oldest)
    ):
        rows.append(
            {
                "route": route_name(r.service, r.operation),
                "state": r.state,
                "count": r.count,
                "final": False,
                "oldest_id": r.id,
                "oldest_received_at": _iso(r.oldest),
                "oldest_age_seconds": round((now - r.oldest).total_seconds(), 1),
            }
        )
    since = now - timedelta(days=1)
    for r in conn.execute(
        select(M.service, M.operation, M.state, func.count().label("count"))
        .where(M.finished_at >= since, M.finished_at <= now, M.state.in_(_FINAL))
        .group_by(M.service, M.operation, M.state)
    ):
        rows.append(
            {
                "route": route_name(r.service, r.operation),
                "state": r.state,
                "count": r.count,
                "final": True,
                "oldest_id": None,
                "oldest_received_at": None,
                "oldest_age_seconds": None,
            }
        )
    rows.sort(key=lambda x: (x["route"], x["final"], x["state"]))
    return rows


def finished_series(conn: Connection, now: datetime) -> dict[str, Any]:
    """Messages finished per minute and the failure rate, over the last hour and the last day."""
    M = messages.c
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)  # the current minute is the last bucket
    start = end - timedelta(days=1)
    minute = _minute(conn, M.finished_at).label("minute")
    failed = func.sum(case((M.state == State.FAILED, 1), else_=0)).label("failed")
    per_minute: dict[int, tuple[int, int]] = {}
    for r in conn.execute(
        select(minute, func.count().label("finished"), failed)
        .where(M.finished_at >= start, M.finished_at < end, M.state.in_(_FINAL))
        .group_by(minute)
    ):
        at = r.minute if isinstance(r.minute, datetime) else datetime.fromisoformat(r.minute)
        index = int((at.replace(tzinfo=None) - start).total_seconds() // 60)
        if 0 <= index < 1440:
            per_minute[index] = (r.finished, int(r.failed or 0))

    def series(first_minute: int, width: int, count: int) -> list[dict[str, Any]]:
        points = []
        for i in range(count):
            lo = first_minute + i * width
            done = sum(per_minute.get(m, (0, 0))[0] for m in range(lo, lo + width))
            bad = sum(per_minute.get(m, (0, 0))[1] for m in range(lo, lo + width))
            points.append(
                {
                    "at": _iso(start + timedelta(minutes=lo)),
                    "finished": done,
                    "failed": bad,
                    "per_minute": round(done / width, 2),
                    "failure_rate": round(bad / done, 4) if done else 0.0,
                }
            )
        return points

    hour = series(1440 - 60, 1, 60)
    day = series(0, int(DAY_BUCKET / HOUR_BUCKET), 96)

    def total(points: list[dict[str, Any]]) -> dict[str, Any]:
        done, bad = sum(p["finished"] for p in points), sum(p["failed"] for p in points)
        return {"finished": done, "failed": bad, "failure_rate": round(bad / done, 4) if done else 0.0}

    return {"hour": hour, "day": day, "hour_total": total(hour), "day_total": total(day)}


def confirmation_states(conn: Connection) -> dict[str, Any]:
    """Confirmations not (yet) OK by state, and the parked ones (FAILED_END) with their message ids."""
    C = confirmations.c
    unsettled = select(C.state, func.count()).where(C.state != ConfirmationState.OK).group_by(C.state)
    counts = dict(conn.execute(unsettled).all())
    parked = [
        {
            "id": r.id,
            "message_id": r.message_id,
            "outcome": r.outcome,
            "attempts": r.attempts,
            "updated_at": _iso(r.updated_at),
            "last_error": error_line(r.last_error),
        }  # the whole text: in the message's detail
        for r in conn.execute(
            select(confirmations)
            .where(C.state == ConfirmationState.FAILED_END)
            .order_by(C.id.desc())
            .limit(PARKED_LISTED)
        )
    ]
    return {"by_state": counts, "parked_count": counts.get(ConfirmationState.FAILED_END, 0), "parked": parked}


def paused_routes(conn: Connection) -> list[dict[str, Any]]:
    """Every paused route, when and why (the drain's row is `draining`)."""
    P = route_pauses.c
    return [
        {"route": r.route, "paused_at": _iso(r.paused_at), "reason": r.reason}
        for r in conn.execute(select(route_pauses).where(P.route != DRAIN).order_by(P.route))
    ]


def overview(now: datetime | None = None, *, hub: Hub | None = None) -> dict[str, Any]:
    """Everything the overview shows except the workers, read in one transaction (of `hub`'s store;
    default: the process's hub)."""
    hub = given(hub)
    now = now or hub.clock()
    with hub.transaction() as conn:
        routes = route_states(conn, now)
        series = finished_series(conn, now)
        confirmations_ = confirmation_states(conn)
        paused = paused_routes(conn)
        draining = drain_reason(conn)
        drain_holds = DRAIN in holding(conn)
        breakers_open = open_breakers(conn, now)
        capped = backlogs(conn, hub.settings, hub.registry)
    live: dict[str, int] = defaultdict(int)
    for row in routes:
        if not row["final"]:
            live[row["state"]] += row["count"]
    return {
        "now": _iso(now),
        "routes": routes,
        "live_by_state": dict(live),
        "finished": series,
        "confirmations": confirmations_,
        "paused_routes": paused,
        "draining": draining,
        "drain_holds_retries": drain_holds,  # the drain also holds the stored messages back (openhub drain)
        "open_breakers": breakers_open,
        "backlogs": capped,
    }


def workers(timeout: float = 0.5, *, hub: Hub | None = None) -> dict[str, Any]:
    """The Celery workers that answered a ping; `available` is False when the broker could not be asked."""
    seen = given(hub).publisher.ping_workers(timeout)
    return {"available": seen is not None, "workers": seen or []}
