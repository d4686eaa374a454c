"""Worker holds: an operator's "finish what you have, take nothing new", for one worker or for every worker
of a host (OpenHub's node state HANDLES_EXISTING_MESSAGES), kept in the store.

A hold names its target as `worker:<id>` (the worker id of a Celery worker's main process, as its heartbeat
row has it) or `host:<hostname>` (every worker on that host, also those started there later: a host held for
a rolling deploy stays held when its workers come back, until an operator lets it take work again). The
worker's main process reads its holds with each heartbeat (openhub.store.workers) and stops taking tasks from
the broker while one holds it (tasks/store_gate.py); the tasks it has run to their end. Being in the store,
a hold outlives a broker reconnection and a restart of the API.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, delete, literal, select

from openhub.store.db import insert_or_ignore, is_postgres
from openhub.store.schema import worker_holds, workers

H = worker_holds.c


def worker_target(worker_id: str) -> str:
    """The hold target of one worker (its main process's worker id)."""
    return f"worker:{worker_id}"


def host_target(host: str) -> str:
    """The hold target of every worker of a host."""
    return f"host:{host}"


def host_of(node: str) -> str:
    """The host of a heartbeat's node (host:pid)."""
    return node.rpartition(":")[0] or node


def hold_on(conn: Connection, worker_id: str, node: str) -> str | None:
    """Why the worker with this id on this node is held (None: it is not), by its own hold or its host's."""
    targets = [worker_target(worker_id), host_target(host_of(node))]
    row = conn.execute(select(H.reason).where(H.target.in_(targets)).order_by(H.since).limit(1)).first()
    return None if row is None else (row.reason or "held by an operator")


def all_holds(conn: Connection) -> dict[str, dict[str, Any]]:
    """Every hold by its target: since when, why, by whom."""
    return {r.target: {"since": r.since, "reason": r.reason, "by": r.by} for r in conn.execute(select(worker_holds))}


def hold(conn: Connection, target: str, reason: str, by: str, now: datetime) -> None:
    """Hold a target (a hold already there keeps its time and reason)."""
    conn.execute(_HOLD[is_postgres(conn)], {"target": target, "since": now, "reason": reason, "by": by})


def release(conn: Connection, target: str) -> bool:
    """Let a target take work again; whether it was held."""
    return conn.execute(delete(worker_holds).where(H.target == target)).rowcount > 0


def forget_gone(conn: Connection) -> int:
    """Drop the holds of workers whose heartbeat rows are gone (deleted a day after their last heartbeat: a
    worker id is a process's, never used again); how many. Hosts' holds stay until let go."""
    ids = select(literal("worker:", String) + workers.c.id)
    return conn.execute(delete(worker_holds).where(H.target.like("worker:%"), H.target.not_in(ids))).rowcount


_HOLD = {pg: insert_or_ignore(worker_holds, pg, index_elements=["target"]) for pg in (False, True)}
