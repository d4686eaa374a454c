"""Worker states, and an operator's "finish what you have, take nothing new" for a worker or a host.

A worker (a Celery worker's main process, which takes the broker's tasks) is in one of these states, as the
store's heartbeats show it (`openhub workers`, `GET /api/v1/workers`, the overview):

- `taking work`: it heartbeats, no operator holds it;
- `finishing`: an operator holds it (openhub.store.holds) and its processes still run steps, or it has not
  said yet that it stopped taking tasks (it reads its holds with each heartbeat);
- `stopped`: held, it says it takes no task, and none of its processes runs a step: safe to take down;
- `store away`: its heartbeat is older than the fence (3/4 of OPENHUB_WORKER_DEAD_AFTER): it cannot reach
  the store, or it hangs, and takes no task meanwhile (tasks/store_gate.py);
- `gone`: another process saw its heartbeat stop for OPENHUB_WORKER_DEAD_AFTER (kept listed for a day).

Holding and letting go are audited in the transaction that writes the hold (`worker.finish`, `worker.resume`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select

from openhub.core.errors import InputError, NotFound
from openhub.engine.hub import Hub, given
from openhub.store import audit, holds
from openhub.store.liveness import dead_among
from openhub.store.schema import workers
from openhub.store.workers import FENCE

W = workers.c
STATES = ("taking work", "finishing", "stopped", "store away", "gone")


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.replace(tzinfo=value.tzinfo or timezone.utc).isoformat()


def _in_flight(row: Any) -> int:
    return len([r for r in (row.runs or "").split(",") if r and not r.startswith("#")])


def worker_states(now: datetime | None = None, *, hub: Hub | None = None) -> list[dict[str, Any]]:
    """Every worker's main process with its state, why it is held, and the step runs in flight in it and its
    pool's processes; oldest first."""
    hub = given(hub)
    dead_after = hub.settings.worker_dead_after
    with hub.transaction() as conn:
        now = now or hub.clock()
        rows = conn.execute(select(workers).order_by(W.up_since)).all()
        held = holds.all_holds(conn)
    dead = dead_among(rows, dead_after)
    fence = timedelta(seconds=dead_after.total_seconds() * FENCE)
    listed = []
    for main in rows:
        if main.taking is None:  # a pool's process, a LocalHub, a poller: no worker of its own
            continue
        pool = [r for r in rows if r.parent == main.node and r.id != main.id and r.id not in dead]
        in_flight = _in_flight(main) + sum(_in_flight(r) for r in pool)
        host = holds.host_of(main.node)
        hold = held.get(holds.worker_target(main.id)) or held.get(holds.host_target(host))
        state = state_of(
            gone=main.id in dead,
            silent=now - main.last_seen > fence,
            held=hold is not None,
            says_taking=bool(main.taking),
            in_flight=in_flight,
        )
        listed.append(
            {
                "id": main.id,
                "node": main.node,
                "host": host,
                "state": state,
                "taking": bool(main.taking),
                "held": hold is not None,
                "held_by": hold and hold["by"],
                "held_since": _iso(hold["since"]) if hold else None,
                "reason": hold and hold["reason"],
                "worker_held": holds.worker_target(main.id) in held,
                "host_held": holds.host_target(host) in held,
                "in_flight": in_flight,
                "processes": 1 + len(pool),
                "up_since": _iso(main.up_since),
                "last_seen": _iso(main.last_seen),
            }
        )
    return listed


def state_of(*, gone: bool, silent: bool, held: bool, says_taking: bool, in_flight: int) -> str:
    """A worker's state: witnessed dead, silent past the fence, held (by its heartbeat's word and its runs), or
    taking work (see the module doc)."""
    if gone:
        return "gone"
    if silent:
        return "store away"
    if held:
        return "finishing" if says_taking or in_flight else "stopped"
    return "taking work"


def held_hosts(*, hub: Hub | None = None) -> list[dict[str, Any]]:
    """The hosts an operator holds (also those with no worker running now), since when, why, by whom."""
    with given(hub).transaction() as conn:
        held = holds.all_holds(conn)
    return [
        {"host": t.partition(":")[2], "since": _iso(h["since"]), "reason": h["reason"], "by": h["by"]}
        for t, h in sorted(held.items())
        if t.startswith("host:")
    ]


def _reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InputError("give a reason: it is shown with the worker and kept in the audit trail")
    return reason.strip()[:500]


def _host(host: str) -> str:
    if not isinstance(host, str) or not 0 < len(host) <= 255 or not host.isprintable() or ":" in host:
        raise InputError("a host is a host name as the workers' nodes show it (host:pid), without the pid")
    return host


def finish_worker(worker_id: str, reason: str = "finish by an operator", *, hub: Hub | None = None) -> dict[str, Any]:
    """Tell one worker to finish what it has and take nothing new (within one heartbeat); `resume_worker` ends it."""
    hub = given(hub)
    return _set(hub, _worker(hub, worker_id), _reason(reason))


def resume_worker(worker_id: str, *, hub: Hub | None = None) -> dict[str, Any]:
    """Let a held worker take work again (within one heartbeat); a hold of its host still holds it."""
    hub = given(hub)
    return _set(hub, _worker(hub, worker_id), None)


def finish_host(host: str, reason: str = "finish by an operator", *, hub: Hub | None = None) -> dict[str, Any]:
    """Tell every worker of a host to finish what it has and take nothing new, also those started there later."""
    return _set(given(hub), holds.host_target(_host(host)), _reason(reason))


def resume_host(host: str, *, hub: Hub | None = None) -> dict[str, Any]:
    """Let the workers of a held host take work again (a worker held on its own stays held)."""
    return _set(given(hub), holds.host_target(_host(host)), None)


def _worker(hub: Hub, worker_id: str) -> str:
    with hub.transaction() as conn:
        row = conn.execute(select(W.id, W.taking).where(W.id == str(worker_id)[:36])).first()
    if row is None or row.taking is None:
        raise NotFound(f"no worker with id {worker_id!r} (`openhub workers` lists them)")
    return holds.worker_target(row.id)


def _set(hub: Hub, target: str, reason: str | None) -> dict[str, Any]:
    """Hold (`reason` given) or release a target, audited in the same transaction."""
    with hub.transaction() as conn:
        now = hub.clock()
        holds.forget_gone(conn)
        was = holds.all_holds(conn).get(target)
        if reason is not None:
            holds.hold(conn, target, reason, audit.current_actor().name, now)
        else:
            holds.release(conn, target)
        audit.record(
            conn,
            "worker.finish" if reason is not None else "worker.resume",
            target=target.replace(":", " ", 1),
            old={"held": was is not None, "reason": was and was["reason"]},
            new={"held": reason is not None, "reason": reason},
            now=now,
        )
    kind, _, name = target.partition(":")
    return {kind: name, "held": reason is not None, "reason": reason}
