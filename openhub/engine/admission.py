"""Whether a step may go on now: the claim of a message, and the call a step is about to make.

Each question is answered with a `Refusal` (the event the message records instead, and its columns)
or None; the engine applies a refusal in one place. Nothing here changes a message's state. Asking
whether a system takes one more call does take its slot or its rate's turn (openhub.outbound.limits), and a
call's end gives them back and tells the system's circuit breaker (`call_ended`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, select

from openhub.core import codes
from openhub.core.config import Settings
from openhub.core.model import Route, RouteStep
from openhub.core.policy import postpone_until
from openhub.core.states import CallState, Event
from openhub.core.verdicts import Verdict
from openhub.engine.funnel import funnel_blocked
from openhub.engine.leases import dropped
from openhub.outbound import breaker, limits
from openhub.store.queries import is_paused, paused_routes
from openhub.store.schema import messages
from openhub.store.workers import liveness

M = messages.c


@dataclass(frozen=True)
class Refusal:
    """A step that may not go on now: the event its message records instead, with its columns."""

    event: Event
    detail: str
    values: dict[str, Any] = field(default_factory=dict)


def claim(conn: Connection, row: Any, route: Route, now: datetime, settings: Settings) -> Refusal | None:
    """Why the chain's first task may not take a NEW/IN_QUEUE message: it expired, a run of an earlier
    chain (cancelled, then restarted) is still calling out, its route is paused, its funnel busy."""
    if row.expires_at is not None and row.expires_at <= now:
        expired = f"expired at {row.expires_at.isoformat()}Z before it was carried out"
        return Refusal(Event.EXPIRED, expired, dict(error_code=codes.EXPIRED, failed_error=expired))
    if row.step_run is not None and in_flight(conn, row.id, now, settings):
        return Refusal(
            Event.POSTPONED,
            "an earlier run of the message is still in flight",
            dict(due_at=postpone_until(now, settings)),
        )
    paused = paused_routes(conn)
    if is_paused(paused, route.name):
        return Refusal(
            Event.POSTPONED,
            "route paused" if route.name in paused else "the hub is draining",
            dict(due_at=postpone_until(now, settings)),
        )
    blocked = funnel_blocked(conn, row, route)
    if blocked:
        # The order timeout counts from when the message first found its funnel blocked, not from
        # when it arrived: time spent paused or waiting for a retry is not time blocked.
        since = row.blocked_since or now
        if route.order_timeout and since < now - route.order_timeout:
            return Refusal(
                Event.ORDER_EXPIRED,
                blocked,
                dict(
                    error_code=codes.ORDER_TIMEOUT,
                    failed_error=f"blocked in funnel {row.funnel!r} longer than {route.order_timeout}: {blocked}",
                ),
            )
        return Refusal(Event.POSTPONED, blocked, dict(blocked_since=since, due_at=postpone_until(now, settings)))
    return None


def breaker_open(conn: Connection, item: RouteStep, now: datetime, settings: Settings) -> Refusal | None:
    """A step whose system is failing waits for its circuit breaker; no failure is counted."""
    system = getattr(item, "system", None)
    until = breaker.closed_until(conn, system, now, settings) if system else None
    if until is None:
        return None
    return Refusal(
        Event.POSTPONED, f"{system} is unavailable: its circuit breaker is open", dict(dropped(), due_at=until)
    )


def against_record(
    conn: Connection, row: Any, key: str, call: Row[Any] | None, now: datetime, settings: Settings
) -> Refusal | None:
    """Why the step's earlier call record `call` (for `key`) stops this message's call: a newer message
    already made it (obsolete), or another message's call is in flight (two versions of one entity must
    not call the system at once; the older would win)."""
    if call is None:
        return None
    if call.ok_message_id is not None and (call.ok_msg_timestamp, call.ok_message_id) > (row.msg_timestamp, row.id):
        return Refusal(
            Event.OBSOLETE, f"newer message {call.ok_message_id} already did {key}", dict(due_at=None, finished_at=now)
        )
    busy = call.state == CallState.PROCESSING and call.message_id != row.id
    if busy and in_flight(conn, call.message_id, now, settings):
        return Refusal(
            Event.POSTPONED,
            f"{key} is being called by message {call.message_id}",
            dict(dropped(), due_at=postpone_until(now, settings)),
        )
    return None


def system_busy(
    conn: Connection, item: RouteStep, run_id: str, lease_until: datetime, now: datetime, settings: Settings
) -> Refusal | None:
    """Why a step may not call its system now: its rate, or its calls in flight (the step's run takes one
    of its slots, held until `lease_until`, where it may). No failure is counted."""
    system = getattr(item, "system", None)
    if not system:
        return None
    rate = settings.system_rates.get(system)
    until = limits.paced(conn, system, rate, now) if rate else None
    if rate and until is not None:
        return Refusal(
            Event.POSTPONED,
            f"{system} is at its rate of {rate[0]} calls per {rate[1]:g} s (OPENHUB_SYSTEM_RATES)",
            dict(dropped(), due_at=until),
        )
    limit = settings.system_limits.get(system)
    if limit and not limits.take(conn, system, limit, run_id, lease_until, now):
        return Refusal(
            Event.POSTPONED,
            f"{system} has its {limit} calls in flight (OPENHUB_SYSTEM_LIMITS)",
            dict(dropped(), due_at=postpone_until(now, settings)),
        )
    return None


def in_flight(conn: Connection, message_id: int, now: datetime, settings: Settings) -> bool:
    """Whether a step of the message is running now (its worker's heartbeat lists the run, by the hub's
    OPENHUB_WORKER_DEAD_AFTER).

    A cancelled message keeps its run until the run ends, so this holds in any state.
    """
    other = conn.execute(select(M.step_run, M.worker, M.due_at, M.updated_at).where(M.id == message_id)).first()
    if other is None or other.step_run is None:
        return False
    known = liveness(conn, settings.worker_dead_after).run_in_flight(other.worker, other.step_run, other.updated_at)
    if known is not None:
        return known
    return other.due_at is not None and bool(other.due_at > now)  # a worker without heartbeat: its lease


def call_ended(
    conn: Connection, item: RouteStep, run_id: str, verdict: Verdict | None, now: datetime, settings: Settings
) -> None:
    """What a step's call tells its system: the slot it held is free again, and (`verdict`, where it was
    recorded) its circuit breaker hears how the call went."""
    system = getattr(item, "system", None)
    if system in settings.system_limits:
        limits.release(conn, system, run_id)
    if not system or verdict is None:
        return
    if verdict.event is Event.TRANSIENT and verdict.against_system:
        breaker.failed(conn, system, now, settings)
    elif verdict.call_state in (CallState.OK, CallState.WAITING):
        breaker.succeeded(conn, system)
