"""The two backends the behaviour suite runs on, each a fresh store and broker.

- embedded: SQLite file + Celery's filesystem transport in a temporary folder (no servers);
- redis-pg: a fresh PostgreSQL database on the machine's server + a private redis-server on a
  free loopback port (so tests may flush or kill it);
- rabbit-pg: the same database + a private RabbitMQ node (its own node name, ports and data folder),
  for the tests that exercise the broker (tests/integration/test_rabbitmq.py, tests/chaos/test_rabbitmq_faults.py);
  not in the behaviour suite's default BACKENDS.
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
        return subprocess.Popen(
            ["redis-server", "--port", str(port), *bind, "--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

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

    def client(self):
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
            except Exception:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        """Terminate it."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@dataclass
class RabbitServer:
    """A private RabbitMQ node: its own node name, AMQP and distribution ports, and data and log folders,
    with no plugin; `consumer_timeout` in seconds, checked every second (not RabbitMQ's every minute)."""

    name: str
    port: int
    workdir: Path
    process: subprocess.Popen | None = None

    @classmethod
    def start(cls, consumer_timeout: float = 3600) -> "RabbitServer":
        """Write its configuration in a fresh folder of its own, start it and wait until it has booted."""
        # Not under pytest's temporary folder, which only its owner may enter (and pytest sets so again):
        # the packaged rabbitmq-server runs the node as the rabbitmq user.
        workdir = Path(tempfile.mkdtemp(prefix="openhub-rabbit-"))
        (workdir / "rabbitmq.conf").write_text(
            f"consumer_timeout = {int(consumer_timeout * 1000)}\nlog.console = false\n"
        )
        (workdir / "advanced.config").write_text("[{rabbit, [{channel_tick_interval, 1000}]}].\n")
        (workdir / "enabled_plugins").write_text("[].\n")
        if os.geteuid() == 0:
            for path in [workdir, *workdir.iterdir()]:
                shutil.chown(path, "rabbitmq")
        server = cls(f"openhub-{uuid.uuid4().hex[:8]}@localhost", free_port(), workdir)
        with open(workdir / "server.out", "wb") as out:
            server.process = subprocess.Popen(
                ["rabbitmq-server"], env=server._env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        server.wait_booted()
        return server

    def wait_booted(self, timeout: float = 120) -> None:
        """Wait until the node has booted (await_startup answers at once while the node is not yet known)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.ctl("await_startup", "--timeout", str(int(max(deadline - time.monotonic(), 1))))
                return
            except RuntimeError:
                if time.monotonic() > deadline or (self.process is not None and self.process.poll() is not None):
                    raise RuntimeError(
                        f"RabbitMQ node {self.name} did not start: {(self.workdir / 'server.out').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.2)

    def _env(self) -> dict[str, str]:
        w = self.workdir
        return dict(
            os.environ,
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(free_port()),
            RABBITMQ_MNESIA_BASE=str(w / "mnesia"),
            RABBITMQ_LOG_BASE=str(w / "log"),
            RABBITMQ_CONFIG_FILE=str(w / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(w / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(w / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(w / "pid"),
        )

    def ctl(self, *args: str, timeout: float = 150) -> str:
        """`rabbitmqctl -n <this node> args...`; its output."""
        done = subprocess.run(["rabbitmqctl", "-n", self.name, *args], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.name}: {done.stdout}{done.stderr}")
        return done.stdout

    @property
    def url(self) -> str:
        """amqp://guest:guest@127.0.0.1:PORT//"""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def restart_app(self, down: float = 0.0) -> None:
        """Stop the RabbitMQ application (every connection cut; durable queues and persistent messages kept)
        and start it again `down` seconds later."""
        self.ctl("stop_app")
        time.sleep(down)  # how long the broker stays away is the fault being injected
        self.ctl("start_app")

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        """Each queue's (ready, unacknowledged) messages."""
        rows = self.ctl("list_queues", "-q", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged")
        return {
            name: (int(ready), int(unacked))
            for name, ready, unacked in (line.split("\t") for line in rows.splitlines() if line.strip())
        }

    def stop(self) -> None:
        """Stop the node and wait for it to end."""
        try:
            self.ctl("stop", timeout=60)
        except Exception:
            pass
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=10)
        if not KEEP:
            shutil.rmtree(self.workdir, ignore_errors=True)


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
        self._as_postgres(
            [
                self._bin("pg_ctl"),
                "-D",
                str(self.datadir),
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "-l",
                str(self.datadir / "server.log"),
                action,
            ]
        )

    def remove(self) -> None:
        """Stop the server (unless a test left it stopped) and delete its folder."""
        try:
            if (self.datadir / "postmaster.pid").exists():  # pg_ctl stop fails on a stopped server
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
        from openhub.store.db import dispose_engines

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
    rabbit: RabbitServer | None = None

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
    from openhub.celery import dispatch
    from openhub.core.config import reset_settings
    from openhub.core.registry import reset_registry
    from openhub.store.db import dispose_engines

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
def backend(
    name: str,
    workdir: Path,
    extra: dict[str, str] | None = None,
    pg_server: str = PG_SERVER,
    consumer_timeout: float = 3600,
) -> Iterator[Backend]:
    """Set up the `embedded`, `redis-pg` or `rabbit-pg` backend in `workdir`, migrated and activated
    (`consumer_timeout`: the RabbitMQ node's, in seconds)."""
    from openhub.store.migrate import upgrade

    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(TEST_SETTINGS, OPENHUB_VAR_DIR=str(workdir / "var"), **(extra or {}))
    if name == "embedded":
        env.update(
            OPENHUB_DATABASE_URL=f"sqlite:///{workdir / 'var' / 'openhub.db'}", OPENHUB_BROKER_URL="filesystem://"
        )
        b = Backend(name, env, workdir)
        b.activate()
        upgrade(b.database_url)
        try:
            yield b
        finally:
            if not KEEP:
                shutil.rmtree(workdir / "var", ignore_errors=True)
        return
    # The PostgreSQL backends differ in their broker alone: a private RabbitMQ node or redis-server.
    rabbit = RabbitServer.start(consumer_timeout) if name == "rabbit-pg" else None
    redis = RedisServer.start(workdir / "redis") if rabbit is None else None
    try:
        with postgres_database(server=pg_server) as url:
            env.update(OPENHUB_DATABASE_URL=url)
            if rabbit is not None:
                env.update(OPENHUB_BROKER_URL=rabbit.url, OPENHUB_CONSUMER_TIMEOUT=str(consumer_timeout))
            elif redis is not None:
                env.update(OPENHUB_BROKER_URL=redis.url)
            env.update(extra or {})
            b = Backend(name, env, workdir, redis=redis, rabbit=rabbit)
            b.activate()
            upgrade(url)
            yield b
    finally:
        for server in (rabbit, redis):
            if server is not None:
                server.stop()


def python() -> str:
    """The interpreter running the tests (the project's virtualenv)."""
    return sys.executable
