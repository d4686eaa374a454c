"""Calls in flight (OPENHUB_SYSTEM_LIMITS="billing=4") and calls per second
(OPENHUB_SYSTEM_RATES="billing=10/1") per external system, shared by every worker through the store.

A step of a rate-limited system takes a token from the system's bucket (refilled at its rate, up
to `calls` tokens) right before its call; with none left it is postponed to when the next token
is due, no failure counted.

A step of a limited system (`@step(system="billing")`) takes one of the system's slots in the
transaction that takes its lease, right before its call, and gives it back in the transaction
that records the outcome. With every slot taken the step is postponed, no failure counted. A slot
is leased like the step (its timeout plus OPENHUB_LEASE_GRACE): a killed worker's slot frees
itself. Slots are rows made on first use; lowering the limit leaves the higher ones unused.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, and_, or_, select, update

from openhub.store.db import insert_or_ignore, is_postgres
from openhub.store.schema import system_rates, system_slots

S = system_slots.c
R = system_rates.c


def paced(conn: Connection, system: str, rate: tuple[int, float], now: datetime) -> datetime | None:
    """Take one token of the system's bucket (`calls` per `seconds`); None when the call may start
    now, else when the next token is due."""
    calls, seconds = rate
    per_second = calls / seconds
    bucket = select(R.tokens, R.updated_at).where(R.system == system)
    if is_postgres(conn):
        bucket = bucket.with_for_update()
    row = conn.execute(bucket).first()
    if row is None:
        # RETURNING, not rowcount: with psycopg an INSERT's rowcount is -1 (true) whether it inserted
        # or did nothing, and every step of a first burst took a token of a bucket that had `calls`.
        made = conn.execute(
            insert_or_ignore(system_rates, is_postgres(conn))
            .values(system=system, tokens=calls - 1, updated_at=now)
            .returning(R.system)
        ).first()
        if made is not None:
            return None
        row = conn.execute(bucket).one()
    # The bucket's clock only goes forward: a transaction that read `now` before another one's commit
    # (a lock wait) refills nothing, and must not set the clock back for the next to refill twice.
    filled_at = max(now, row.updated_at)
    tokens = min(float(calls), row.tokens + (filled_at - row.updated_at).total_seconds() * per_second)
    if tokens < 1:
        return filled_at + timedelta(seconds=(1 - tokens) / per_second)
    conn.execute(update(system_rates).where(R.system == system).values(tokens=tokens - 1, updated_at=filled_at))
    return None


def take(conn: Connection, system: str, limit: int, run_id: str, held_until: datetime, now: datetime) -> bool:
    """Take a free slot of `system` for the step run `run_id`; False when all `limit` are taken."""
    free = (
        select(S.slot)
        .where(and_(S.system == system, S.slot < limit, or_(S.step_run.is_(None), S.held_until < now)))
        .order_by(S.slot)
        .limit(1)
    )
    if is_postgres(conn):
        free = free.with_for_update(skip_locked=True)
    slot = conn.execute(free).scalar()
    if slot is None and _made(conn, system, limit):
        slot = conn.execute(free).scalar()
    if slot is None:
        return False
    conn.execute(
        update(system_slots)
        .where(and_(S.system == system, S.slot == slot))
        .values(step_run=run_id, held_until=held_until)
    )
    return True


def release(conn: Connection, system: str, run_id: str) -> None:
    """The run's call is over: its slot is free for the next."""
    conn.execute(
        update(system_slots)
        .where(and_(S.system == system, S.step_run == run_id))
        .values(step_run=None, held_until=None)
    )


def release_runs(conn: Connection, runs: list[str]) -> None:
    """Runs that will never record an outcome (their worker died): their slots are free at once."""
    conn.execute(update(system_slots).where(S.step_run.in_(runs)).values(step_run=None, held_until=None))


def _made(conn: Connection, system: str, limit: int) -> bool:
    """Make the system's missing slots (first use, or a raised limit); whether any was made."""
    have = conn.execute(select(S.slot).where(S.system == system)).scalars().all()
    missing = [{"system": system, "slot": n} for n in range(limit) if n not in set(have)]
    if not missing:
        return False
    conn.execute(insert_or_ignore(system_slots, is_postgres(conn)).values(missing))
    return True
