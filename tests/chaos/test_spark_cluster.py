"""`openhub report` and `openhub archive` on a real Spark standalone cluster, against local[*].

A master and two workers (1 core, 1 GiB each) run as processes of their own, from the Spark of
the pyspark install (tests/support/spark_cluster.py). The PostgreSQL reads are cut into many small
id ranges (OPENHUB_SPARK_JDBC_PARTITION_ROWS=40), so both executors read the store through the
JDBC driver that `spark.jars` ships them, and the archive's Parquet is written by the executors
into a folder they share with the driver. The results must be the same as local[*], row for row;
an archive whose driver is SIGKILLed midway and run again must leave each message archived once.

In the chaos half: the cluster's JVMs take a while to start on a loaded 2-core box.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from openhub.store.db import dispose_engines, utcnow
from tests.integration.pipeline_stores import (
    POSTGRES_ADMIN_URL,
    archive_midway,
    generate_store,
    postgres_database,
    snapshot,
    wait_while_running,
)
from tests.integration.test_pipeline_archive import assert_nothing_lost_nothing_duplicated, read_archive
from tests.support.spark_cluster import Cluster, cluster_env, standalone_cluster

pytest.importorskip("pyspark", reason="the spark extra is not installed")
# Each test starts five or six JVMs (drivers, executors); a box loaded tenfold (the CI halves side by side)
# stretches every Spark stage, so the deadline is sized for the box, not for the code.
pytestmark = pytest.mark.timeout(900)

PARTITION_ROWS = "120"  # a few hundred messages become a few id ranges, spread over both executors
OLDER_THAN = timedelta(minutes=45)  # the generated store has no message finishing near this cutoff
RUN_TIMEOUT = 400.0  # one archive run, on a box loaded like CI


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two workers, up and registered."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as running:
        yield running


@pytest.fixture
def cluster_settings(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's (and its drivers') environment for the cluster: loopback, small partitions."""
    env = cluster_env()
    env["OPENHUB_SPARK_JDBC_PARTITION_ROWS"] = PARTITION_ROWS
    env["OPENHUB_SPARK_SHUFFLE_PARTITIONS"] = "2"  # one per executor: a few hundred rows need no more
    for name in (
        "SPARK_LOCAL_IP",
        "SPARK_HOME",
        "PYSPARK_PYTHON",
        "OPENHUB_SPARK_JDBC_PARTITION_ROWS",
        "OPENHUB_SPARK_SHUFFLE_PARTITIONS",
    ):
        monkeypatch.setenv(name, env[name])
    return env


def stop_session() -> None:
    """Stop this process's SparkSession, if any (on the cluster: its executors give their cores back)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def session(master: str) -> Any:
    """A SparkSession on `master` with the PostgreSQL driver, replacing any earlier one in this process."""
    from openhub.pipeline.session import find_jdbc_jar, spark_session

    stop_session()
    return spark_session(master, [find_jdbc_jar("postgresql")], "openhub cluster test")


def parquet_rows(directory: Path) -> list[dict[str, Any]]:
    """The rows of a report table's Parquet, in file order."""
    import pyarrow.parquet as pq

    return [row for path in sorted(directory.glob("*.parquet")) for row in pq.ParquetFile(path).read().to_pylist()]


def same_rows(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> bool:
    """Row for row equal; floats to 1e-9 (partial sums may add up in another order)."""
    if len(left) != len(right):
        return False
    for a, b in zip(left, right):
        if a.keys() != b.keys():
            return False
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12):
                    return False
            elif x != y:
                return False
    return True


def test_report_on_the_cluster_matches_local(
    cluster: Cluster, cluster_settings: dict[str, str], tmp_path: Path
) -> None:
    from openhub.pipeline.report import TABLES, build_report
    from openhub.pipeline.source import parse_source

    with postgres_database() as url:
        from openhub.store.migrate import upgrade

        upgrade(url)
        generate_store(url, roots=120, seed=61)
        store = parse_source(url)
        local = build_report(session("local[*]"), store, tmp_path / "local")
        before = len(cluster.executor_logs())
        try:
            on_cluster = build_report(session(cluster.master_url), store, tmp_path / "cluster")
        finally:
            stop_session()
    assert len(cluster.executor_logs()) >= before + 2  # both workers ran an executor for it
    assert local.total("messages") > 100
    for table in TABLES:
        left, right = parquet_rows(tmp_path / "local" / table), parquet_rows(tmp_path / "cluster" / table)
        assert left, table
        assert same_rows(left, right), f"{table}: the cluster's rows differ from local[*]'s"
        assert same_rows(local.tables[table], on_cluster.tables[table]), table


@contextmanager
def copy_of(url: str) -> Iterator[str]:
    """A copy of the PostgreSQL database at `url` (CREATE DATABASE … TEMPLATE), dropped afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{make_url(url).database}_copy"
    dispose_engines()  # a template must have no open connection
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{make_url(url).database}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _archive_command(url: str, out: Path, master: str, batch_size: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "openhub.pipeline.commands",
        "archive",
        "--older-than",
        f"{int(OLDER_THAN.total_seconds())}s",
        "--out",
        str(out),
        "--batch-size",
        str(batch_size),
        "--master",
        master,
        "--source",
        url,
    ]


def _run(command: list[str], env: dict[str, str], log: Path) -> str:
    with open(log, "wb") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=RUN_TIMEOUT)
    output = log.read_text()
    assert done.returncode == 0, output[-3000:]
    return output


def test_archive_killed_on_the_cluster_then_rerun_matches_local(
    cluster: Cluster, cluster_settings: dict[str, str], tmp_path: Path
) -> None:
    """Two copies of one store: local[*] archives one in a single run; on the cluster, the other's
    archive driver is SIGKILLed after a batch, mid second, and run again. Same archive, same store."""
    from openhub.store.migrate import upgrade

    generated_at = utcnow()
    with postgres_database() as on_cluster:
        upgrade(on_cluster)
        generate_store(on_cluster, roots=100, seed=71, now=generated_at)
        with copy_of(on_cluster) as on_local:
            before = snapshot(on_cluster)
            assert before == snapshot(on_local)

            # local[*]: one clean run.
            local_out = tmp_path / "local-archive"
            _run(_archive_command(on_local, local_out, "local[*]", 1000), cluster_settings, tmp_path / "local.log")

            # The cluster: killed midway (the driver and its JVM), then run again.
            out = tmp_path / "shared" / "archive"  # the folder the executors and the driver share
            log = tmp_path / "killed.log"
            with open(log, "wb") as sink:
                process = subprocess.Popen(
                    _archive_command(on_cluster, out, cluster.master_url, 10),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env=cluster_settings,
                    start_new_session=True,
                )
            try:
                stored = len(before["messages"])
                wait_while_running(lambda: archive_midway(out, on_cluster, stored), process, log, RUN_TIMEOUT)
                os.killpg(process.pid, signal.SIGKILL)
                assert process.wait(timeout=30) == -signal.SIGKILL
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            interrupted = snapshot(on_cluster)
            assert len(interrupted["messages"]) < len(before["messages"])  # it had deleted some batches
            output = _run(
                _archive_command(on_cluster, out, cluster.master_url, 1000), cluster_settings, tmp_path / "rerun.log"
            )
            assert "recovered" in output  # it found the batch the kill left in staging

            after, after_local = snapshot(on_cluster), snapshot(on_local)
    cutoff = generated_at - OLDER_THAN
    archived = assert_nothing_lost_nothing_duplicated(before, after, out, cutoff)
    assert archived == read_archive(local_out)[0]  # the same rows, archived once, as local[*]'s
    assert after == after_local  # and the same rows left in the store
    assert any("app-" in str(p) for p in cluster.executor_logs())
