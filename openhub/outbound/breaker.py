"""Circuit breakers per external system (`@step(system="billing")`), shared by every worker through
the store.

OPENHUB_BREAKER_FAILURES transient failures in a row of any message's steps calling a system open
its breaker (only the system's own faults count, see `counts_against_system`: a bug in one route's
step must not stop every route calling that system) for OPENHUB_BREAKER_OPEN: meanwhile those
steps are postponed without counting a failure, so an outage does not burn every message's
retries. Then one step may try (the first to take the trial, by compare-and-set); its success closes
the breaker, its failure opens it again.
The reads and writes join the step's own transactions: no commit of their own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
from sqlalchemy import Connection, and_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from openhub.core.config import Settings
from openhub.core.context import aware
from openhub.core.errors import TransientError
from openhub.store.db import is_postgres
from openhub.store.schema import breakers

B = breakers.c

# Answers that say the system itself is failing or overloaded (RFC 9110: 408, 425, 429 and 5xx).
_SYSTEM_STATUSES = frozenset({408, 425, 429})
# Transport errors of this process's own making, raised before the request reached the system: a header
# value with a newline (h11 refuses to send it), a URL scheme httpx cannot speak, no free connection in
# the client's own pool. A message whose payload makes one must not open a breaker every route shares.
LOCAL_FAULTS: tuple[type[BaseException], ...] = (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.PoolTimeout)


def counts_against_system(exc: BaseException) -> bool:
    """Whether a step's transient failure is its system's fault and counts against its breaker.

    Counted: transport errors and timeouts (httpx's TransportError, the built-in ConnectionError and
    TimeoutError), an HTTPStatusError with 5xx/408/425/429, and TransientError (what HttpCall raises
    for those, and what a step raises to say its system is down). Not counted, wherever it is in the
    chain of causes: a transport error of this process's own (`LOCAL_FAULTS`: the request never left
    it), so a TransientError raised from one does not count either. Anything else, such as a KeyError
    in the step's own code before any call, is the message's fault, not the system's.
    """
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__
    if any(isinstance(error, LOCAL_FAULTS) for error in chain):
        return False
    for error in chain:  # an error raised from the system's fault counts
        if isinstance(error, httpx.HTTPStatusError):
            status = error.response.status_code
            return status >= 500 or status in _SYSTEM_STATUSES
        if isinstance(error, (httpx.TransportError, ConnectionError, TimeoutError, TransientError)):
            return True
    return False


def closed_until(conn: Connection, system: str, now: datetime, settings: Settings) -> datetime | None:
    """Until when the system takes no call (None: this step may call it, perhaps as the trial)."""
    row = conn.execute(select(B.failures, B.open_until).where(B.system == system)).first()
    if row is None or row.open_until is None:
        return None
    if row.open_until > now:
        return row.open_until
    # Open long enough: the first step here is the trial; the others wait another period.
    again = now + settings.breaker_open
    taken = conn.execute(
        update(breakers)
        .where(and_(B.system == system, B.open_until == row.open_until))
        .values(open_until=again, updated_at=now)
    ).rowcount
    return None if taken else again


def failed(conn: Connection, system: str, now: datetime, settings: Settings) -> None:
    """A step calling the system failed transiently: one more in a row; open the breaker at the limit."""
    dialect = postgresql if is_postgres(conn) else sqlite
    count = conn.execute(
        dialect.insert(breakers)
        .values(system=system, failures=1, updated_at=now)
        .on_conflict_do_update(index_elements=["system"], set_={"failures": B.failures + 1, "updated_at": now})
        .returning(B.failures)
    ).scalar_one()
    if count >= settings.breaker_failures:
        conn.execute(update(breakers).where(B.system == system).values(open_until=now + settings.breaker_open))


def succeeded(conn: Connection, system: str) -> None:
    """A step calling the system succeeded: the breaker closes (a no-op while it is closed)."""
    conn.execute(
        update(breakers)
        .where(and_(B.system == system, B.failures > 0))
        .values(failures=0, open_until=None, reason=None)
    )


def state(conn: Connection, system: str, now: datetime) -> dict[str, Any]:
    """The breaker of `system` as it stands at `now` (closed with no failures where it has no row)."""
    row = conn.execute(select(breakers).where(B.system == system)).first()
    if row is None:
        return {"system": system, "open": False, "failures": 0, "open_until": None, "reason": None}
    return {
        "system": system,
        "open": row.open_until is not None and row.open_until > now,
        "failures": row.failures,
        "reason": row.reason,
        "open_until": aware(row.open_until).isoformat() if row.open_until else None,
    }


def set_open_until(conn: Connection, system: str, until: datetime | None, reason: str | None, now: datetime) -> None:
    """An operator's write: open the breaker until `until` (its failures kept), or close it (None: failures 0)."""
    dialect = postgresql if is_postgres(conn) else sqlite
    values: dict[str, Any] = {"open_until": until, "reason": reason, "updated_at": now}
    if until is None:
        values["failures"] = 0
    conn.execute(
        dialect.insert(breakers)
        .values(
            system=system, failures=values.get("failures", 0), **{k: v for k, v in values.items() if k != "failures"}
        )
        .on_conflict_do_update(index_elements=["system"], set_=values)
    )


def open_breakers(conn: Connection, now: datetime) -> list[dict[str, Any]]:
    """The systems whose breaker is open now, with until when and the failures that opened it."""
    return [
        {"system": r.system, "open_until": aware(r.open_until).isoformat(), "failures": r.failures, "reason": r.reason}
        for r in conn.execute(select(breakers).where(B.open_until > now).order_by(B.system))
    ]
