"""A Spark standalone cluster on this machine: one master and N workers, each its own process.

Started from the Spark inside the pyspark install (`spark-class …deploy.master.Master` /
`…deploy.worker.Worker`), on free loopback ports with a work directory per worker, and ready only
once the master's JSON status lists every worker ALIVE. Used by tests/chaos/test_spark_cluster.py
and bench/pipeline.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .backends import free_port

START_TIMEOUT = 120.0  # two JVMs per worker on a loaded 2-core box take tens of seconds


def spark_class() -> str:
    """The spark-class launcher of the installed pyspark."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def cluster_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the cluster's processes and its drivers: everything on loopback."""
    import sys

    import pyspark

    env = dict(os.environ if base is None else base)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    env["PYSPARK_PYTHON"] = sys.executable
    env.setdefault("SPARK_NO_DAEMONIZE", "1")
    return env


@dataclass
class Cluster:
    """A running standalone cluster: its master URL, web UI and the processes behind them."""

    master_url: str
    ui_url: str
    root: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def status(self) -> dict:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        """Workers the master counts as ALIVE (0 while it is not answering yet: its web UI not up, or up and
        answering /json/ with its HTML page before the JSON handler is attached, as a loaded box showed)."""
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except (OSError, ValueError):  # json.JSONDecodeError is a ValueError
            return 0

    def executor_logs(self) -> list[Path]:
        """The stderr files of every executor the workers have run (work/<app>/<executor>/stderr)."""
        return sorted(self.root.glob("worker-*/work/app-*/*/stderr"))

    def log_tail(self) -> str:
        """The end of each daemon's log, for a failure message."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.root.glob("*.log"))
        )


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)  # the worker's group holds its executors too
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def standalone_cluster(root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Iterator[Cluster]:
    """Start a master and `workers` workers under `root`; stop them all on exit."""
    root.mkdir(parents=True, exist_ok=True)
    env = cluster_env()
    port, ui = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", root)
    launcher = spark_class()
    try:
        cluster.processes.append(
            _start(
                [
                    launcher,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(ui),
                ],
                root / "master.log",
                env,
            )
        )
        for n in range(workers):
            work = root / f"worker-{n}" / "work"
            work.mkdir(parents=True)
            cluster.processes.append(
                _start(
                    [
                        launcher,
                        "org.apache.spark.deploy.worker.Worker",
                        cluster.master_url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--work-dir",
                        str(work),
                        "--port",
                        str(free_port()),
                        "--webui-port",
                        str(free_port()),
                    ],
                    root / f"worker-{n}.log",
                    env,
                )
            )
        deadline = time.monotonic() + START_TIMEOUT
        while cluster.alive_workers() < workers:
            dead = [p for p in cluster.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise AssertionError(
                    f"the Spark cluster did not come up with {workers} workers "
                    f"({'a daemon exited' if dead else 'timed out'}):\n{cluster.log_tail()}"
                )
            time.sleep(0.2)  # polling interval of the status check, not a synchronisation
        yield cluster
    finally:
        for process in reversed(cluster.processes):
            _stop(process)
