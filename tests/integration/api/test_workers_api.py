"""/api/v1/workers (states) and an operator's hold of a worker or a host over HTTP (issue 36, worker states).

No worker runs here: a worker's main process is a heartbeat row as it writes one; the real workers' side is
tests/integration/test_worker_states.py.
"""

from __future__ import annotations

import uuid

from sqlalchemy import select

from openhub.core.config import get_settings
from openhub.store.schema import worker_holds, workers
from tests.integration.api.conftest import ADMIN
from tests.support.process_store import store_now, transaction


def _worker(host: str, *, taking: bool | None = True, runs: str | None = None) -> str:
    worker_id, now = str(uuid.uuid4()), store_now()
    with transaction() as conn:
        conn.execute(
            workers.insert().values(
                id=worker_id,
                node=f"{host}:10",
                parent=f"{host}:1",
                up_since=now,
                last_seen=now,
                taking=taking,
                runs=runs,
            )
        )
    return worker_id


def _touch(host: str) -> None:
    """The host's rows beating just now (a fresh unbroken run: they witness nobody's death)."""
    with transaction() as conn:
        now = store_now()
        conn.execute(workers.update().where(workers.c.node.like(f"{host}:%")).values(up_since=now, last_seen=now))


def _states(client, host: str) -> dict[str, dict]:
    """The states, the host's rows beating just now."""
    _touch(host)
    r = client.get("/api/v1/workers", headers=ADMIN)
    assert r.status_code == 200, r.text
    return {w["id"]: w for w in r.json()["states"]}


def test_states_holds_and_their_refusals(client) -> None:
    host = f"h-{uuid.uuid4().hex[:8]}"
    main = _worker(host)
    with transaction() as conn:  # one of its pool's processes, running a step
        now = store_now()
        conn.execute(
            workers.insert().values(
                id=str(uuid.uuid4()), node=f"{host}:11", parent=f"{host}:10", up_since=now, last_seen=now, runs="#1,1.a"
            )
        )
    states = _states(client, host)
    assert states[main]["state"] == "taking work" and states[main]["in_flight"] == 1 and states[main]["processes"] == 2

    r = client.post(f"/api/v1/hosts/{host}:finish", json={"reason": "kernel update"}, headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"host": host, "held": True, "reason": "kernel update"}
    w = _states(client, host)[main]
    assert (w["state"], w["reason"], w["host_held"], w["held_by"]) == ("finishing", "kernel update", True, "admin")
    listed = client.get("/api/v1/workers", headers=ADMIN).json()["held_hosts"]
    assert [h["reason"] for h in listed if h["host"] == host] == ["kernel update"]
    with transaction() as conn:  # its heartbeat read the hold, and its pool's run ended
        conn.execute(workers.update().where(workers.c.node.like(f"{host}:%")).values(taking=False, runs="#1"))
        conn.execute(workers.update().where(workers.c.id == main).values(taking=False))
    assert _states(client, host)[main]["state"] == "stopped"
    assert client.post(f"/api/v1/hosts/{host}:resume", headers=ADMIN).json()["held"] is False
    assert _states(client, host)[main]["held"] is False

    assert client.post(f"/api/v1/workers/{main}:finish", json={"reason": " "}, headers=ADMIN).status_code == 400
    assert client.post(f"/api/v1/workers/{uuid.uuid4()}:finish", json={}, headers=ADMIN).status_code == 404
    pool = _worker(host, taking=None)  # a pool's process is no worker of its own
    assert client.post(f"/api/v1/workers/{pool}:finish", json={}, headers=ADMIN).status_code == 404
    assert client.post("/api/v1/hosts/a%3Ab:finish", json={}, headers=ADMIN).status_code == 400
    assert client.post(f"/api/v1/workers/{main}:finish", json={}, headers=ADMIN).json()["held"] is True
    assert _states(client, host)[main]["reason"] == "finish by an operator"
    with transaction() as conn:  # its row forgotten a day after its last heartbeat: its hold goes with the next action
        conn.execute(workers.delete().where(workers.c.id == main))
    assert client.post(f"/api/v1/hosts/{host}:finish", json={}, headers=ADMIN).status_code == 200
    with transaction() as conn:
        assert conn.execute(select(worker_holds.c.target).where(worker_holds.c.target.like(f"%{main}"))).all() == []
        assert conn.execute(select(worker_holds.c.target).where(worker_holds.c.target == f"host:{host}")).all()


def test_openhub_workers_lists_holds_and_lets_go_audited_as_the_local_user(api_env) -> None:
    import json

    from click.testing import CliRunner

    from openhub.cli import main
    from openhub.store import audit

    host = f"c-{uuid.uuid4().hex[:8]}"
    worker_id = _worker(host)
    runner = CliRunner()
    assert "workers" in runner.invoke(main, ["--help"]).output
    held = runner.invoke(main, ["workers", "finish", worker_id, "--reason", "disk swap"])
    assert held.exit_code == 0 and "finishes what it has" in held.output, held.output
    _touch(host)
    listed = runner.invoke(main, ["workers"]).output
    line = next(x for x in listed.splitlines() if x.startswith(worker_id))
    assert "\tfinishing\t" in line and "disk swap" in line, line
    entry = audit.entries(action="worker.finish", limit=1, url=get_settings().database_url)[0]
    assert entry["who"].startswith("local:") and entry["target"] == f"worker {worker_id}"
    assert runner.invoke(main, ["workers", "finish", "--host", host]).exit_code == 0
    shown = json.loads(runner.invoke(main, ["workers", "--json"]).output)
    assert host in [h["host"] for h in shown["held_hosts"]]
    assert runner.invoke(main, ["workers", "resume", worker_id]).exit_code == 0
    assert runner.invoke(main, ["workers", "resume", "--host", host]).exit_code == 0
    mine = [w for w in json.loads(runner.invoke(main, ["workers", "--json"]).output)["workers"] if w["id"] == worker_id]
    assert mine and mine[0]["held"] is False
    both = runner.invoke(main, ["workers", "finish", worker_id, "--host", host])
    assert both.exit_code == 2 and "one worker" in both.output
