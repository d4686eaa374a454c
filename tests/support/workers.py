"""Real Celery workers as subprocesses (`celery -A tasks worker`), so tests can SIGKILL them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Self

PROJECT = Path(__file__).resolve().parents[2]


class _CeleryProcess:
    """A `celery -A tasks ...` subprocess in its own session, its output in `log_path`."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    workdir: Path
    process: subprocess.Popen | None = None

    companion: "_CeleryProcess | None" = None  # a process killed and stopped with this one (a gevent worker's beat)

    def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            self.args, env=self.env, cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _groups(self) -> list[subprocess.Popen]:
        """The processes whose groups (sessions) are this one: its own, and its companion's."""
        both = [self.process, self.companion.process if self.companion else None]
        return [p for p in both if p is not None and p.poll() is None]

    def _signal(self, signum: int, timeout: float) -> None:
        alive = self._groups()
        for proc in alive:
            os.killpg(proc.pid, signum)
        for proc in alive:
            proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group (main process and pool; and its companion's) at once, as a
        crashed machine would."""
        self._signal(signal.SIGKILL, timeout=10)

    def stop(self, timeout: float = 30) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not exit in time."""
        try:
            self._signal(signal.SIGTERM, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        """`with Worker(...).start() as worker:` stops it after the block."""
        self.stop()


class Worker(_CeleryProcess):
    """One `celery -A tasks worker` process (optionally with a beat; `pool` as -P names it). gevent
    takes no embedded beat (-B): its beat is a standalone `celery beat` started, stopped and killed with
    the worker, as an embedded one would be."""

    def __init__(
        self,
        env: dict[str, str],
        workdir: Path,
        *,
        beat: bool = True,
        concurrency: int = 2,
        name: str | None = None,
        queues: str | None = None,
        pool: str | None = None,
        exclude_queues: str | None = None,
    ) -> None:
        self.name = name or f"w{uuid.uuid4().hex[:6]}"
        self.workdir = workdir
        self.heartbeat = workdir / f"{self.name}.heartbeat"
        self.log_path = workdir / f"{self.name}.log"
        # OPENHUB_TEST_WORKER: the test routes' calls say which worker made them (tests/support/routes.call)
        self.env = dict(
            os.environ,
            **env,
            OPENHUB_WORKER_HEARTBEAT_FILE=str(self.heartbeat),
            OPENHUB_TEST_WORKER=self.name,
            PYTHONPATH=str(PROJECT),
        )
        self.args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{self.name}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
        if beat and pool == "gevent":
            self.companion = Beat(env, workdir)
        elif beat:
            self.args += ["-B", "--schedule", str(workdir / f"{self.name}-beat-schedule")]
        if queues:
            self.args += ["-Q", queues]
        if exclude_queues:
            self.args += ["--exclude-queues", exclude_queues]
        if pool:
            self.args += ["--pool", pool]
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "Worker":
        """Start the worker and wait until it is ready to consume."""
        self.heartbeat.unlink(missing_ok=True)
        self._launch()
        assert self.process is not None
        if self.companion is not None:
            self.companion._launch()
        deadline = time.monotonic() + timeout
        while not self.heartbeat.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready after {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        """What the worker printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def child_pids(self) -> list[int]:
        """Process ids of the worker's pool processes."""
        assert self.process is not None
        out = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]


class Beat(_CeleryProcess):
    """One standalone `celery -A tasks beat` process, for workers that take no embedded one (gevent)."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / f"beat-{uuid.uuid4().hex[:6]}.log"
        self.env = dict(os.environ, **env, PYTHONPATH=str(PROJECT))
        self.args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(workdir / f"{self.log_path.stem}-schedule"),
        ]
        self.process: subprocess.Popen | None = None

    def start(self) -> "Beat":
        """Start it (the poller's first tick follows within OPENHUB_POLL_INTERVAL)."""
        self._launch()
        return self
