"""The `openhub` command line (click), described in openhub/api/README.md ("Command line").

Every command that shows data takes `--json` for scripts and prints readable tables (rich)
otherwise. The commands call the same Python functions as the HTTP API (`openhub.submit`,
`openhub.restart`, ...); an openhub error ends the command with its message on stderr and exit
code 1, never a traceback.

This module holds the `main` group and its small top-level commands; the bigger groups live in
modules of their own (messages.py, status.py, confirmations.py, demo.py, operators.py), which
never import this one: it mounts them below.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from openhub.cli.config import config
from openhub.cli.confirmations import confirmations, exchanges
from openhub.cli.demo import demo
from openhub.cli.inputs import json_given, json_input, timestamp
from openhub.cli.messages import messages
from openhub.cli.operators import audit_command, breakers, tokens
from openhub.cli.output import counted, escaped, make_console, verbatim
from openhub.cli.status import status
from openhub.cli.workers import workers
from openhub.core.config import get_settings
from openhub.core.errors import OpenHubError


class _Main(click.Group):
    """The command group that turns openhub errors into a message and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OpenHubError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)


@click.group(cls=_Main)
def main() -> None:
    """openhub: an asynchronous integration hub on Celery."""


@main.group()
def db() -> None:
    """The message store."""


@db.command("upgrade")
@click.option("--url", help="Database URL (default: OPENHUB_DATABASE_URL).")
def db_upgrade(url: str | None) -> None:
    """Create or migrate the schema to the latest version (Alembic)."""
    from openhub.store.migrate import upgrade

    target = url or get_settings().database_url
    before, after = upgrade(target)
    if before is None:
        click.echo(f"database at {_safe(target)}: schema created (revision {after})")
    elif before != after:
        click.echo(f"database at {_safe(target)}: schema migrated from revision {before} to {after}")
    else:
        click.echo(f"database at {_safe(target)} is up to date (revision {after})")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--concurrency", default=2, show_default=True, type=int, help="Worker processes.")
@click.option(
    "--failure-rate",
    default=0.2,
    show_default=True,
    type=float,
    help="Share of simulated external calls that fail, to show retries.",
)
@click.option(
    "--example-port",
    default=8765,
    show_default=True,
    type=int,
    help="Port of the simulated external systems (0: any free one).",
)
def dev(host: str, port: int, concurrency: int, failure_rate: float, example_port: int) -> None:
    """All in one on the embedded default: simulated external systems, worker, beat and ingress."""
    from openhub.dev import run_dev
    from openhub.store.migrate import upgrade

    upgrade(get_settings().database_url)
    sys.exit(
        run_dev(host=host, port=port, concurrency=concurrency, failure_rate=failure_rate, example_port=example_port)
    )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def routes(as_json: bool) -> None:
    """List the loaded routes and their steps."""
    from openhub.core.registry import get_registry
    from openhub.core.topics import is_topic, subscribers

    registry = get_registry()
    data = [
        {
            "route": r.name,
            "steps": [{"key": s.key, "scope": s.scope} for s in r.steps],
            "funnel": r.funnel is not None,
            "guaranteed_order": r.guaranteed_order,
            "subscribes": list(r.subscribes),
            "subscribers": [s.name for s in subscribers(registry.routes, r.name)] if is_topic(r) else None,
        }
        for r in registry.routes.values()
    ]
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for r in data:
        if r["subscribers"] is not None:  # a topic: its messages go to these routes, one message each
            click.echo(f"{r['route']}: topic -> " + (", ".join(r["subscribers"]) or "no subscribers"))
            continue
        steps = " -> ".join(f"{s['key']}[{s['scope']}]" for s in r["steps"])
        click.echo(
            f"{r['route']}: {steps}" + (f" (subscribes to {', '.join(r['subscribes'])})" if r["subscribes"] else "")
        )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-counts", is_flag=True, help="The catalogue only: do not count messages (no database needed).")
def errors(as_json: bool, no_counts: bool) -> None:
    """List every error code: the hub's and the routes' own, what each means, whether it is retried, what
    to do, and how many messages carry it (list them: `openhub messages list --error-code CODE`)."""
    from openhub.service.catalogue import listing

    items = listing(with_counts=not no_counts)
    if as_json:
        click.echo(json.dumps(items, indent=2, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("code", "retried", "messages", "from", "meaning", "what to do", show_lines=True)
    for e in items:
        count = "" if e.get("messages") is None else str(e["messages"])
        code = e["code"] if e["declared"] else f"{e['code']} (undeclared)"
        table.add_row(
            verbatim(code),
            e["retried"],
            count,
            verbatim(e["origin"]),
            verbatim(e["meaning"]),
            verbatim(e["action"]),
        )
    make_console().print(table)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="uvicorn worker processes.")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
def serve(host: str, port: int, workers: int, log_level: str) -> None:
    """Serve the HTTP API, /admin and /metrics with uvicorn."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG
    from uvicorn.logging import DefaultFormatter

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") == "":
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]  # set but empty would make prometheus_client write to the cwd
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each worker counts requests in its own memory; the multiprocess directory lets
        # /metrics add them up whichever worker answers the scrape.
        directory = get_settings().var_dir / f"prometheus-{os.getpid()}"
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    log_config = json.loads(json.dumps(LOGGING_CONFIG))
    log_config["loggers"]["openhub"] = {"handlers": ["default"], "level": log_level.upper(), "propagate": False}
    # Lines about a message carry its ids, as text or JSON (OPENHUB_LOG_FORMAT; openhub/core/logs.py); every line
    # is redacted (openhub/core/redact.py).
    log_config["filters"] = {
        "message_fields": {"()": "openhub.core.logs.MessageFields"},
        "redacting": {"()": "openhub.core.logs.RedactingFilter"},
    }
    log_config["handlers"]["default"]["filters"] = ["message_fields", "redacting"]
    log_config["handlers"]["access"]["filters"] = ["redacting"]
    if get_settings().log_format == "json":
        log_config["formatters"]["default"] = {"()": "openhub.core.logs.JsonFormatter"}
    else:
        inner = DefaultFormatter(LOGGING_CONFIG["formatters"]["default"]["fmt"])
        log_config["formatters"]["default"] = {"()": "openhub.core.logs.TextFormatter", "inner": inner}
    from openhub.api.server import uvicorn_options

    uvicorn.run(
        "openhub.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        log_config=log_config,
        access_log=False,
        **uvicorn_options(),
    )


@main.command()
@click.argument("route")
@click.option("--source-system", "-s", required=True, help="The source system the message comes from.")
@click.option("--correlation-id", "-c", required=True, help="Unique per source system; a repeat is a duplicate.")
@json_input("the payload")
@click.option("--process-id", help="Groups messages of one business process.")
@click.option("--msg-timestamp", help="ISO 8601 timestamp of the message (orders entity versions).")
@click.option("--expires-at", help="ISO 8601; not started by then, the message ends FAILED (error code EXPIRED).")
@click.option("--priority", type=click.IntRange(0, 9), help="0-9, higher = sooner (default: the route's, else 4).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def submit(
    route: str,
    source_system: str,
    correlation_id: str,
    payload: str | None,
    payload_file: Path | None,
    process_id: str | None,
    msg_timestamp: str | None,
    expires_at: str | None,
    priority: int | None,
    as_json: bool,
) -> None:
    """Submit one message to ROUTE (service.operation)."""
    import openhub

    data = json_given(payload, payload_file)
    timestamp(msg_timestamp, "--msg-timestamp")
    timestamp(expires_at, "--expires-at")
    view = openhub.submit(
        route,
        data,
        source_system=source_system,
        correlation_id=correlation_id,
        process_id=process_id,
        msg_timestamp=msg_timestamp,
        expires_at=expires_at,
        priority=priority,
    )
    summary = {
        "id": view.id,
        "correlation_id": view.correlation_id,
        "route": view.route,
        "state": view.state,
        "duplicate": view.duplicate,
        "priority": view.priority,
    }
    if as_json:
        click.echo(json.dumps(summary))
    elif view.duplicate:
        click.echo(f"duplicate: message {view.id} already has correlation id {view.correlation_id} ({view.state})")
    else:
        click.echo(f"accepted: message {view.id} ({view.route}, {view.state})")


@main.command()
@click.option("--reason", default="drained by an operator", show_default=True)
@click.option("--off", is_flag=True, help="End the drain: messages are taken again.")
@click.option("--status", "status_only", is_flag=True, help="Only tell whether the hub drains.")
@click.option(
    "--hold-retries/--new-only",
    default=True,
    show_default=True,
    help="Also hold the stored messages (retries, postponed, NEW), or refuse new messages only.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def drain(reason: str, off: bool, status_only: bool, hold_retries: bool, as_json: bool) -> None:
    """Drain the hub before maintenance: new messages are refused, those under way finish; by default none
    starts either (--new-only: the stored ones, retries included, go on)."""
    from openhub.service import pauses

    redriven = None
    if off:
        redriven = pauses.undrain()
    elif not status_only:
        pauses.drain(reason, hold_retries=hold_retries)
    state = pauses.drain_status()
    if as_json:
        click.echo(json.dumps(state if redriven is None else {**state, "redriven": redriven}))
    elif state["draining"]:
        click.echo(
            f"draining ({escaped(state['reason'])}"
            + ("" if state["hold_retries"] else "; new messages only, the stored ones go on")
            + f"): {counted(state['under_way'], 'message')} still under way"
        )
    else:
        click.echo(
            "not draining"
            + (f"; {counted(redriven, 'held-back message')} re-driven now" if redriven is not None else "")
        )


@main.command()
@click.argument("route")
@click.option("--reason", default="paused by an operator", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pause(route: str, reason: str, as_json: bool) -> None:
    """Pause ROUTE: none of its messages starts until it is resumed."""
    import openhub

    openhub.pause(route, reason)
    click.echo(json.dumps({"route": route, "paused": True}) if as_json else f"{route} paused")


@main.command()
@click.argument("route")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def resume(route: str, as_json: bool) -> None:
    """Resume ROUTE; its postponed messages are re-driven now."""
    import openhub

    redriven = openhub.resume(route)
    click.echo(
        json.dumps({"route": route, "paused": False, "redriven": redriven})
        if as_json
        else f"{route} resumed; {counted(redriven, 'postponed message')} re-driven now"
    )


def _safe(url: str) -> str:
    """A database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


try:  # the Spark pipeline is an optional extra
    from openhub.pipeline.commands import archive, report

    main.add_command(report)
    main.add_command(archive)
except ImportError:
    pass


main.add_command(messages)
main.add_command(status)
main.add_command(confirmations)
main.add_command(exchanges)
main.add_command(demo)
main.add_command(tokens)
main.add_command(audit_command)
main.add_command(breakers)
main.add_command(workers)
main.add_command(config)
