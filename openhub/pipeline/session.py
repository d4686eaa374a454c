"""The SparkSession of a pipeline job, with Java and the JDBC drivers located up front.

Spark's own failures when Java or a driver is missing are a Py4J stack trace or a
`ClassNotFoundException` deep inside a job; checking before the JVM starts turns them into one
`ConfigurationError` that names the missing piece and how to install it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from openhub.core.errors import ConfigurationError, OpenHubError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

# Where Debian's libpostgresql-jdbc-java and libxerial-sqlite-jdbc-java put their jars.
JAR_DIRS = (Path("/usr/share/java"), Path("/usr/local/share/java"))


@dataclass(frozen=True)
class JdbcDriver:
    """A JDBC driver: its class, the jar names to look for and the package that ships them."""

    kind: str
    driver_class: str
    jar_names: tuple[str, ...]
    debian_package: str


DRIVERS = {
    "postgresql": JdbcDriver("postgresql", "org.postgresql.Driver", ("postgresql.jar",), "libpostgresql-jdbc-java"),
    "sqlite": JdbcDriver(
        "sqlite", "org.sqlite.JDBC", ("sqlite-jdbc.jar", "xerial-sqlite-jdbc.jar"), "libxerial-sqlite-jdbc-java"
    ),
}


def require_pyspark() -> None:
    """Fail with a clear message when the `spark` extra is not installed."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "pyspark not installed: the data pipeline needs the spark extra (pip install 'openhub[spark]')"
        ) from None


def find_java() -> str:
    """The `java` executable Spark will start (JAVA_HOME first, then PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise ConfigurationError(
            f"Java not found: JAVA_HOME={java_home} has no bin/java; point JAVA_HOME at a JRE 17 or unset it"
        )
    found = shutil.which("java")
    if found is None:
        raise ConfigurationError(
            "Java not found: install a JRE 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


def find_jdbc_jar(kind: str, explicit: str | None = None) -> str:
    """The jar of the JDBC driver for `kind` ("postgresql" or "sqlite"); `explicit` wins if given."""
    driver = DRIVERS[kind]
    if explicit:
        if not Path(explicit).is_file():
            raise ConfigurationError(f"JDBC driver jar not found: {explicit} (given with --jdbc-jar)")
        return explicit
    for directory in JAR_DIRS:
        for name in driver.jar_names:
            candidate = directory / name
            if candidate.is_file():
                return str(candidate.resolve())
    raise ConfigurationError(
        f"{kind} JDBC driver not found in {', '.join(map(str, JAR_DIRS))}: install it "
        f"(apt-get install {driver.debian_package}) or give its jar with --jdbc-jar PATH"
    )


DEFAULT_MASTER = "local[*]"


def spark_master(explicit: str | None = None) -> str:
    """The Spark master a job runs on: `--master`, else OPENHUB_SPARK_MASTER, else local[*].

    `local[N]`/`local[*]` runs in this process; `spark://host:7077` on a standalone cluster;
    `k8s://https://api:6443` on Kubernetes (executor pods); `yarn` on Hadoop.
    """
    master = (explicit or os.environ.get("OPENHUB_SPARK_MASTER") or DEFAULT_MASTER).strip()
    if not master.startswith(("local", "spark://", "k8s://", "yarn")):
        raise ConfigurationError(
            f"unsupported Spark master {master!r}: use local[*], spark://HOST:7077, "
            "k8s://https://HOST:PORT or yarn (--master or OPENHUB_SPARK_MASTER)"
        )
    return master


def spark_session(
    master: str = DEFAULT_MASTER, jars: tuple[str, ...] | list[str] = (), app_name: str = "openhub"
) -> SparkSession:
    """Start (or reuse) the SparkSession with the given driver jars on its classpath.

    Timestamps in the store are naive UTC, so the JVM and the SQL session both run in UTC: a JDBC
    read then neither shifts nor reinterprets them. On a cluster, `spark.jars` is what ships the
    JDBC driver to the executors (the driver serves the jar; executors fetch it at start), and
    anything else (executor memory and cores, S3A credentials) comes from spark-defaults.conf in
    SPARK_CONF_DIR, which Spark reads before these settings.
    """
    require_pyspark()
    find_java()
    from pyspark.sql import SparkSession

    utc = "-Duser.timezone=UTC"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the commands show their own progress
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", utc)
        .config("spark.executor.extraJavaOptions", utc)
        .config("spark.driver.memory", os.environ.get("OPENHUB_SPARK_DRIVER_MEMORY", "2g"))
        # The default of 200 shuffle partitions is for clusters; on a few cores it is pure overhead.
        .config("spark.sql.shuffle.partitions", os.environ.get("OPENHUB_SPARK_SHUFFLE_PARTITIONS", "8"))
        # Archive partitions are `date=…/route=…`: keep them strings, a route like "1.5" is no number.
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # Py4J/PySpark raise their own types; translate them here, once.
        raise OpenHubError(f"Spark could not start (master {master}): {exc}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark
