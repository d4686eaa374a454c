"""The click commands `openhub report` and `openhub archive` (mounted by `openhub.cli`).

Also runnable on their own, without the main CLI: `python -m openhub.pipeline.commands archive …`.
pyspark is imported only when a command runs, so listing `openhub --help` needs no Spark.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from openhub.core.errors import OpenHubError
from openhub.pipeline.session import spark_master, spark_session
from openhub.pipeline.source import jars_for, parse_source

_console = Console(stderr=True)


def _moment(value: str | None, option: str) -> datetime | None:
    """An ISO date or date-time as naive UTC (an offset, if given, is converted)."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"not an ISO date or date-time: {value!r}", param_hint=option) from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def _local_dir(out: str) -> Path:
    """`--out` as a directory path; an object-store URL is refused (the archive publishes by rename)."""
    if "://" in out:
        raise click.BadParameter(
            f"{out} is a URL: --out must be a directory every executor and the "
            "driver can write (a local disk, or NFS/EFS/CephFS mounted on all of "
            "them); see openhub/pipeline/README.md",
            param_hint="--out",
        )
    return Path(out)


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
        transient=False,
    )


_master = click.option(
    "--master",
    metavar="URL",
    help="Spark master: local[*] (the default, this machine), spark://HOST:7077 (a "
    "standalone cluster), k8s://https://HOST:PORT; default OPENHUB_SPARK_MASTER.",
)
_jdbc_jar = click.option(
    "--jdbc-jar",
    type=click.Path(dir_okay=False),
    help="JDBC driver jar to use instead of the one found under /usr/share/java.",
)


@click.command("report")
@click.option("--from", "start", metavar="ISO", help="First moment of the range (received_at >= it).")
@click.option("--to", "end", metavar="ISO", help="End of the range (received_at < it).")
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Directory for Parquet tables and report.html."
)
@click.option(
    "--source",
    metavar="URL|parquet:DIR|PATH",
    help="Database URL (default OPENHUB_DATABASE_URL), parquet:DIR for an archive, or a path.",
)
@_master
@_jdbc_jar
def report(
    start: str | None, end: str | None, out: str, source: str | None, master: str | None, jdbc_jar: str | None
) -> None:
    """Report on the messages received in a time range: Parquet tables and one HTML page."""
    from openhub.pipeline.page import write_page
    from openhub.pipeline.report import TABLES, build_report

    begin, finish = _moment(start, "--from"), _moment(end, "--to")
    if begin and finish and begin >= finish:
        raise click.BadParameter("--from must be before --to", param_hint="--from")
    directory = _local_dir(out)
    try:
        store = parse_source(source)
        with _progress() as bar:
            task = bar.add_task("starting Spark", total=len(TABLES) + 3)
            spark = spark_session(spark_master(master), jars_for(store, jdbc_jar), "openhub report")
            bar.advance(task)

            def stage(name: str) -> None:
                bar.update(task, description=name)
                bar.advance(task)

            result = build_report(spark, store, directory, begin, finish, stage)
            bar.update(task, description="drawing the page")
            page = write_page(result, directory)
            bar.update(task, description="done", completed=len(TABLES) + 3)
    except OpenHubError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{result.total('messages')} messages reported; page: {page}")


@click.command("archive")
@click.option(
    "--older-than",
    required=True,
    metavar="DURATION",
    help="Archive final messages that finished longer ago than this (30d, 12h, 15m, 0s).",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Archive directory (Parquet).")
@click.option(
    "--batch-size",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Messages per batch: written, then deleted from the database in one transaction.",
)
@click.option("--source", metavar="URL", help="Database URL (default OPENHUB_DATABASE_URL).")
@_master
@_jdbc_jar
def archive(
    older_than: str, out: str, batch_size: int, source: str | None, master: str | None, jdbc_jar: str | None
) -> None:
    """Move old final messages with their calls and history to Parquet; safe to stop and rerun."""
    from openhub.pipeline.archive import parse_duration, run_archive

    directory = _local_dir(out)
    try:
        age = parse_duration(older_than)
        store = parse_source(source)
        with _progress() as bar:
            task = bar.add_task("starting Spark", total=None)
            spark = spark_session(spark_master(master), jars_for(store, jdbc_jar), "openhub archive")

            def advance(done: int, total: int, note: str) -> None:
                bar.update(task, description=note, completed=done, total=total or None)

            result = run_archive(spark, store, directory, age, batch_size, progress=advance)
    except OpenHubError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = ", ".join(f"{n} {t}" for t, n in result.rows.items())
    click.echo(f"archived {result.messages} messages in {result.batches} batches ({rows})")
    if result.recovered_batches or result.discarded_batches or result.withdrawn:
        click.echo(
            f"recovered {result.recovered_batches} interrupted batches, discarded "
            f"{result.discarded_batches} unfinished ones, withdrew {result.withdrawn} changed messages"
        )


@click.group()
def pipeline() -> None:
    """openhub's Spark jobs, runnable without the main CLI."""


pipeline.add_command(report)
pipeline.add_command(archive)

if __name__ == "__main__":
    pipeline()
