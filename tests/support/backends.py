"""The two backends the behaviour suite runs on, each a fresh store and broker.

- embedded: SQLite file + Celery's filesystem transport in a temporary folder (no servers);
- redis-pg: a fresh PostgreSQL database on the machine's server + a private redis-server on a
  free loopback port (so tests may flush or kill it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import sqlalchemy

KEEP = bool(os.environ.get("OPENHUB_TEST_KEEP"))  # keep the embedded store after the run, to look at
PG_SERVER = os.environ.get("OPENHUB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")

# Short intervals so retries, postpones and lease repairs happen within a test's patience.
TEST_SETTINGS = {
    "OPENHUB_RETRY_INTERVAL": "0.3",
    "OPENHUB_POSTPONE_INTERVAL": "0.3",
    "OPENHUB_POLL_INTERVAL": "0.3",
    "OPENHUB_LEASE_GRACE": "4",
    "OPENHUB_STEP_TIMEOUT": "20",
    "OPENHUB_CONFIRM_INTERVAL": "0.3",
    "OPENHUB_WORKER_DEAD_AFTER": "2",
    "OPENHUB_ROUTES": "tests.support.routes",
    "OPENHUB_METRICS_CACHE": "0",  # scrapes read the store each time, so tests compare with it at once
    "OPENHUB_BREAKER_FAILURES": "3",  # only the "billed" routes name a system
    "OPENHUB_BREAKER_OPEN": "2",
    "OPENHUB_SYSTEM_LIMITS": "test-post=1,fused-post=1,batched-post=1",  # only the "limited" routes call these
    "OPENHUB_SYSTEM_RATES": "test-paced=2/1,fused-paced=2/1,batched-paced=2/1",  # and the "paced" routes these
}


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A private redis-server on a free loopback port."""

    port: int
    process: subprocess.Popen
    workdir: Path
    also_on: str | None = None

    @classmethod
    def start(cls, workdir: Path, port: int | None = None, also_on: str | None = None) -> "RedisServer":
        """Start it and wait until it answers PING; `also_on`: an address of a link the test made
        (tests/support/hosts.py), listened on too."""
        port = port or free_port()
        server = cls(port, cls._launch(workdir, port, also_on), workdir, also_on)
        server.wait_ready()
        return server

    @staticmethod
    def _launch(workdir: Path, port: int, also_on: str | None) -> subprocess.Popen:
        # Nothing is saved: a server started again on the same port starts empty, as a restarted
        # Redis without persistence (or one that lost its disk) does.
        workdir.mkdir(parents=True, exist_ok=True)
        bind = ["--bind", "127.0.0.1", also_on, "--protected-mode", "no"] if also_on else ["--bind", "127.0.0.1"]
        return subprocess.Popen(["redis-server", "--port", str(port), *bind, "--save", "",
                                 "--appendonly", "no", "--dir", str(workdir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def restart(self, down: float = 0.0) -> None:
        """Stop it and start it again on the same port `down` seconds later, empty: every client is cut,
        every queue lost."""
        self.stop()
        time.sleep(down)  # how long the broker stays away is the fault being injected
        self.process = self._launch(self.workdir, self.port, self.also_on)
        self.wait_ready()

    @property
    def url(self) -> str:
        """redis://127.0.0.1:PORT/0"""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):  # noqa: ANN201
        """A redis-py client."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def wait_ready(self, timeout: float = 20) -> None:
        """Wait until the server answers PING."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        """Terminate it."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@dataclass
class PostgresServer:
    """A private PostgreSQL cluster on a free loopback port, for tests that restart it."""

    port: int
    datadir: Path
    also_on: str | None = None  # an address of a link the test made, listened on too (tests/support/hosts.py)

    @staticmethod
    def _bin(name: str) -> str:
        versions = sorted(Path("/usr/lib/postgresql").iterdir())
        return str(versions[-1] / "bin" / name)

    @staticmethod
    def _as_postgres(args: list[str]) -> None:
        # PostgreSQL refuses to run as root; the tests run as root on these machines.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(prefix + args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @classmethod
    def start(cls, also_on: str | None = None, clients: str | None = None) -> "PostgresServer":
        """initdb a cluster in a fresh folder the postgres user can reach, and start it; `also_on`: an
        address it listens on besides 127.0.0.1, `clients`: the network (CIDR) trusted there."""
        workdir = Path(tempfile.mkdtemp(prefix="openhub-pg-"))
        datadir = workdir / "pgdata"
        if os.geteuid() == 0:
            shutil.chown(workdir, "postgres")
        cls._as_postgres([cls._bin("initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        if clients:
            with open(datadir / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {clients} trust\n")
        server = cls(free_port(), datadir, also_on)
        server.pg_ctl("start")
        return server

    def pg_ctl(self, action: str) -> None:
        """start, stop or restart (fast: every client is disconnected) and wait."""
        listen = f"127.0.0.1,{self.also_on}" if self.also_on else "127.0.0.1"
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses={listen} -c fsync=off -c max_connections=300"
        self._as_postgres([self._bin("pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "-t", "60",
                           "-o", options, "-l", str(self.datadir / "server.log"), action])

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        try:
            self.pg_ctl("stop")
        finally:
            shutil.rmtree(self.datadir.parent, ignore_errors=True)

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the server (no database)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"


@contextmanager
def postgres_database(prefix: str = "openhub_test", server: str = PG_SERVER) -> Iterator[str]:
    """A fresh PostgreSQL database (dropped afterwards); yields its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        from openhub.db import dispose_engines

        dispose_engines()
        admin.dispose()  # the server may have restarted since: use a fresh connection
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@dataclass
class Backend:
    """A store and a broker, with the OPENHUB_* environment that points at them."""

    name: str
    env: dict[str, str]
    workdir: Path
    redis: RedisServer | None = None
    workers: list = field(default_factory=list)

    @property
    def database_url(self) -> str:
        """OPENHUB_DATABASE_URL"""
        return self.env["OPENHUB_DATABASE_URL"]

    def activate(self) -> None:
        """Point this test process at the backend (settings, registry, engines, Celery app)."""
        activate(self.env)


def activate(env: dict[str, str]) -> None:
    """Set the OPENHUB_* environment in this process and forget everything cached from the old one.

    Only OPENHUB_* names: nothing restores any other, so another (OTEL_*, say) would outlive the test and
    reach every process a later test starts from this one's environment."""
    from openhub import dispatch
    from openhub.config import reset_settings
    from openhub.db import dispose_engines
    from openhub.registry import reset_registry

    foreign = sorted(k for k in env if not k.startswith("OPENHUB_"))
    assert not foreign, f"activate sets only OPENHUB_* names, not {foreign}: pass those to the processes started"
    for key in [k for k in os.environ if k.startswith("OPENHUB_")]:
        del os.environ[key]
    os.environ.update(env)
    reset_settings()
    reset_registry()
    dispose_engines()
    dispatch.reset_app()


@contextmanager
def backend(name: str, workdir: Path, extra: dict[str, str] | None = None,
            pg_server: str = PG_SERVER) -> Iterator[Backend]:
    """Set up the `embedded` or `redis-pg` backend in `workdir`, migrated and activated."""
    from openhub.migrate import upgrade

    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(TEST_SETTINGS, OPENHUB_VAR_DIR=str(workdir / "var"), **(extra or {}))
    if name == "embedded":
        env.update(OPENHUB_DATABASE_URL=f"sqlite:///{workdir / 'var' / 'openhub.db'}",
                   OPENHUB_BROKER_URL="filesystem://")
        b = Backend(name, env, workdir)
        b.activate()
        upgrade(b.database_url)
        try:
            yield b
        finally:
            if not KEEP:
                shutil.rmtree(workdir / "var", ignore_errors=True)
        return
    redis = RedisServer.start(workdir / "redis")
    try:
        with postgres_database(server=pg_server) as url:
            env.update(OPENHUB_DATABASE_URL=url, OPENHUB_BROKER_URL=redis.url)
            b = Backend(name, env, workdir, redis=redis)
            b.activate()
            upgrade(url)
            yield b
    finally:
        redis.stop()


def python() -> str:
    """The interpreter running the tests (the project's virtualenv)."""
    return sys.executable
