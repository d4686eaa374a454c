"""Smoke test of deploy/Procfile: its processes, started with honcho against a real PostgreSQL and
Redis on this machine, accept a message through the ingress, carry it to OK, and stop cleanly.

Only the listen ports differ from deploy/Procfile (free ports instead of 8000 and 5555, so the test
can run beside other work on the same machine); the test asserts that is the only difference.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.waiting import wait_for

from .test_deploy import DEPLOY, LONG_RUNNING, read_procfile

ROOT = DEPLOY.parent
BIN = Path(sys.executable).parent
PG = {"host": "127.0.0.1", "port": "5432", "user": "postgres"}
START_TIMEOUT = 90  # seconds for every process to come up (Celery and Spark imports are slow)
DELIVERY_TIMEOUT = 60  # seconds for the message to reach OK
# honcho SIGKILLs what has not stopped 5 s after its SIGTERM, a dev tool's choice: a clean CI run's loaded box
# once took longer to stop an idle worker and confirmer. The deploy gives each process at least 30 s
# (ingress and beat; workers 330 s: deploy/README.md), and that is what a process must stop within here.
STOP_GRACE = 30
HONCHO = (
    f"import sys, honcho.command, honcho.manager; honcho.manager.KILL_WAIT = {STOP_GRACE}; "
    "sys.argv[0] = 'honcho'; sys.exit(honcho.command.main())"
)

pytestmark = [pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def psql(sql: str, database: str = "postgres") -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "psql",
            "-h",
            PG["host"],
            "-p",
            PG["port"],
            "-U",
            PG["user"],
            "-d",
            database,
            "-v",
            "ON_ERROR_STOP=1",
            "-Atqc",
            sql,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def database() -> str:
    """A fresh PostgreSQL database with a random name, dropped afterwards."""
    if (
        shutil.which("psql") is None
        or subprocess.run(["pg_isready", "-q", "-h", PG["host"], "-p", PG["port"]], timeout=30).returncode != 0
    ):
        pytest.skip("no PostgreSQL answering at 127.0.0.1:5432 (.ci/run starts one)")
    name = f"openhub_smoke_{secrets.token_hex(6)}"
    created = psql(f"CREATE DATABASE {name}")
    assert created.returncode == 0, created.stderr
    try:
        yield f"postgresql+psycopg://{PG['user']}@{PG['host']}:{PG['port']}/{name}"
    finally:
        dropped = psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        assert dropped.returncode == 0, dropped.stderr


@pytest.fixture
def broker(tmp_path) -> str:
    """A private redis-server on a free port, without persistence, stopped afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    directory = tmp_path / "redis"
    directory.mkdir()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def answers() -> bool:
            if process.poll() is not None:
                pytest.fail(f"redis-server exited with {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_for(answers, 30, "redis-server to answer PING")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=30)


def smoke_procfile(path: Path, ingress_port: int, flower_port: int) -> dict[str, str]:
    """deploy/Procfile with the two listen ports moved; asserts nothing else changed."""
    original = read_procfile()
    moved = {
        name: command.replace("--port 8000", f"--port {ingress_port}").replace("--port=5555", f"--port={flower_port}")
        for name, command in original.items()
    }
    assert moved["ingress"] != original["ingress"] and moved["flower"] != original["flower"]
    for name in original:
        assert re.sub(r"--port[ =]\d+", "--port N", moved[name]) == re.sub(r"--port[ =]\d+", "--port N", original[name])
    path.write_text("".join(f"{name}: {command}\n" for name, command in moved.items()))
    return moved


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid` as {pid: start time} (the start time guards against reuse)."""
    children: dict[int, list[int]] = {}
    start: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        start[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = start[child]
            todo.append(child)
    return found


def still_running(processes: dict[int, str]) -> list[str]:
    """The processes of `processes` that are still running (zombies count as exited)."""
    running = []
    for pid, started in processes.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[19] == started and fields[0] != "Z":
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            running.append(f"{pid} {cmdline.strip()}")
    return running


def test_deploy_smoke_procfile_processes_carry_a_message_to_ok(tmp_path, database, broker):
    ingress_port, flower_port = free_port(), free_port()
    procfile = tmp_path / "Procfile"
    commands = smoke_procfile(procfile, ingress_port, flower_port)
    api_key, admin_token, metrics_token = (secrets.token_urlsafe(32) for _ in range(3))
    flower_user, flower_password = "smoke", secrets.token_urlsafe(12)
    heartbeat = tmp_path / "worker.heartbeat"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OPENHUB_", "CELERY_", "FLOWER_"))},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "OPENHUB_DATABASE_URL": database,
        "OPENHUB_BROKER_URL": broker,
        "OPENHUB_ROUTES": "tests.acceptance.smoke_routes",
        "OPENHUB_API_KEYS": f"SMOKE={api_key}",
        "OPENHUB_ADMIN_TOKEN": admin_token,
        "OPENHUB_METRICS_TOKEN": metrics_token,
        "OPENHUB_POLL_INTERVAL": "1",
        "OPENHUB_VAR_DIR": str(tmp_path / "var"),
        "OPENHUB_WORKER_HEARTBEAT_FILE": str(heartbeat),
        "FLOWER_BASIC_AUTH": f"{flower_user}:{flower_password}",
    }

    release = subprocess.run(
        commands["release"], shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert release.returncode == 0, release.stdout + release.stderr

    log_path = tmp_path / "honcho.log"
    with open(log_path, "w") as log:
        honcho = subprocess.Popen(
            [sys.executable, "-c", HONCHO, "-f", str(procfile), "-d", str(tmp_path), "start", *LONG_RUNNING],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started: dict[int, str] = {}
    try:

        def running(condition):
            """`condition`, failing at once (with honcho's output) if honcho already gave up."""

            def check():
                if honcho.poll() is not None:
                    pytest.fail(f"honcho exited early ({honcho.returncode}):\n{log_path.read_text()[-6000:]}")
                return condition()

            return check

        ingress = httpx.Client(base_url=f"http://127.0.0.1:{ingress_port}", timeout=10)
        flower = httpx.Client(base_url=f"http://127.0.0.1:{flower_port}", timeout=10)

        def status(client: httpx.Client, path: str, **kwargs) -> int:
            try:
                return client.get(path, **kwargs).status_code
            except httpx.TransportError:
                return 0

        wait_for(running(lambda: status(ingress, "/readyz") == 200), START_TIMEOUT, "ingress /readyz")
        assert status(ingress, "/healthz") == 200
        wait_for(running(lambda: status(flower, "/healthcheck") == 200), START_TIMEOUT, "Flower")
        assert status(flower, "/api/workers") == 401, "Flower must require its basic auth"
        wait_for(running(heartbeat.exists), START_TIMEOUT, "the worker's heartbeat file")

        correlation_id = f"smoke-{secrets.token_hex(4)}"
        accepted = ingress.post(
            "/api/v1/messages/smoke/ping",
            json={"ping": "pong"},
            headers={"Authorization": f"Bearer {api_key}", "X-Correlation-Id": correlation_id},
        )
        assert accepted.status_code == 202, accepted.text
        body = accepted.json()
        assert body["correlation_id"] == correlation_id and body["id"]

        def message_state() -> bool:
            reply = ingress.get(f"/api/v1/messages/{body['id']}", headers={"Authorization": f"Bearer {admin_token}"})
            assert reply.status_code == 200, reply.text
            state = reply.json()["state"]
            assert state not in ("FAILED", "CANCEL", "SKIPPED"), reply.text
            return state == "OK"

        wait_for(running(message_state), DELIVERY_TIMEOUT, f"message {body['id']} to reach OK")

        # The worker liveness probe's premise: the heartbeat is fresh while the worker consumes.
        assert time.time() - heartbeat.stat().st_mtime < 120
        # Beat schedules the poller (the only process nothing else in this test exercises).
        wait_for(
            running(lambda: "Sending due task openhub-poll" in log_path.read_text()),
            START_TIMEOUT,
            "beat to send openhub.poll",
        )
        # The two scrape targets export what the alerts and the dashboard query (metrics.txt).
        lines = (DEPLOY / "metrics.txt").read_text().splitlines()
        split = lines.index("# flower")
        hub_metrics = [n for n in lines[:split] if n and not n.startswith("#")]
        flower_metrics = [n for n in lines[split + 1 :] if n and not n.startswith("#")]
        assert ingress.get("/metrics").status_code == 401  # Prometheus scrapes with its own token
        scraped = ingress.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert scraped.status_code == 200
        missing = [n for n in hub_metrics if not re.search(rf"^# TYPE {n} ", scraped.text, re.M)]
        assert not missing, f"the ingress does not export {missing}"
        exported = flower.get("/metrics", auth=(flower_user, flower_password)).text
        missing = [n for n in flower_metrics if f"# TYPE {n} " not in exported]
        assert not missing, f"Flower does not export {missing}"

        started = descendants(honcho.pid)
        assert len(started) >= len(LONG_RUNNING)
        ingress.close()
        flower.close()
    finally:
        if not started and honcho.poll() is None:
            started = descendants(honcho.pid)
        if honcho.poll() is None:
            honcho.send_signal(signal.SIGTERM)
        try:
            honcho.wait(timeout=60)
        finally:
            if honcho.poll() is None:
                honcho.kill()
                honcho.wait(timeout=30)
            leftovers = still_running(started)
            for line in leftovers:  # clean up what we started before failing
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split()[0]), signal.SIGKILL)
    output = log_path.read_text()
    stopping = output[output.find("SIGTERM received") :]
    assert "sending SIGKILL" not in output, f"a process had to be killed:\n{stopping[-8000:]}"
    assert not leftovers, f"still running after honcho stopped: {leftovers}"
    stops = re.findall(r"\|\s+(\w+)\.\d+ stopped \(rc=(-?\d+)\)", output)
    assert {name for name, _ in stops} == set(LONG_RUNNING), output[-6000:]
