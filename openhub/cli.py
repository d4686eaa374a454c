"""The `openhub` command line (click): DESIGN.md §6.

Every command that shows data takes `--json` for scripts and prints readable tables (rich)
otherwise. The commands call the same Python functions as the HTTP API (`openhub.submit`,
`openhub.restart`, ...); an openhub error ends the command with its message on stderr and exit
code 1, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

from .config import get_settings
from .errors import OpenHubError


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
    from .migrate import upgrade

    target = url or get_settings().database_url
    upgrade(target)
    click.echo(f"database at {_safe(target)} is up to date")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--concurrency", default=2, show_default=True, type=int, help="Worker processes.")
@click.option("--failure-rate", default=0.2, show_default=True, type=float,
              help="Share of simulated external calls that fail, to show retries.")
def dev(host: str, port: int, concurrency: int, failure_rate: float) -> None:
    """All in one on the embedded default: simulated external systems, worker, beat and ingress."""
    from .dev import run_dev
    from .migrate import upgrade

    upgrade()
    sys.exit(run_dev(host=host, port=port, concurrency=concurrency, failure_rate=failure_rate))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def routes(as_json: bool) -> None:
    """List the loaded routes and their steps."""
    from .registry import get_registry

    data = [{"route": r.name, "steps": [{"key": s.key, "scope": s.scope} for s in r.steps],
             "funnel": r.funnel is not None, "guaranteed_order": r.guaranteed_order}
            for r in get_registry().routes.values()]
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for r in data:
        click.echo(f"{r['route']}: " + " -> ".join(f"{s['key']}[{s['scope']}]" for s in r["steps"]))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="uvicorn worker processes.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(host: str, port: int, workers: int, log_level: str) -> None:
    """Serve the HTTP API, /admin and /metrics with uvicorn."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

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
    from .api.server import PROTOCOL

    uvicorn.run("openhub.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, log_config=log_config, access_log=False, proxy_headers=True, http=PROTOCOL)


@main.command()
@click.argument("route")
@click.option("--source-system", "-s", required=True, help="The source system the message comes from.")
@click.option("--correlation-id", "-c", required=True, help="Unique per source system; a repeat is a duplicate.")
@click.option("--payload", "-p", help="The payload as JSON text.")
@click.option("--file", "-f", "payload_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file holding the JSON payload.")
@click.option("--process-id", help="Groups messages of one business process.")
@click.option("--msg-timestamp", help="ISO 8601 timestamp of the message (orders entity versions).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def submit(route: str, source_system: str, correlation_id: str, payload: str | None, payload_file: Path | None,
           process_id: str | None, msg_timestamp: str | None, as_json: bool) -> None:
    """Submit one message to ROUTE (service.operation)."""
    import openhub

    if (payload is None) == (payload_file is None):
        raise click.UsageError("give exactly one of --payload and --file")
    text = payload if payload is not None else payload_file.read_text(encoding="utf-8")  # type: ignore[union-attr]
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload/--file") from None
    _timestamp(msg_timestamp, "--msg-timestamp")
    view = openhub.submit(route, data, source_system=source_system, correlation_id=correlation_id,
                          process_id=process_id, msg_timestamp=msg_timestamp)
    summary = {"id": view.id, "correlation_id": view.correlation_id, "route": view.route, "state": view.state,
               "duplicate": view.duplicate}
    if as_json:
        click.echo(json.dumps(summary))
    elif view.duplicate:
        click.echo(f"duplicate: message {view.id} already has correlation id {view.correlation_id} ({view.state})")
    else:
        click.echo(f"accepted: message {view.id} ({view.route}, {view.state})")


@main.group()
def messages() -> None:
    """Search, inspect, restart and cancel messages."""


@messages.command("list")
@click.option("--state", type=click.Choice(["NEW", "IN_QUEUE", "PROCESSING", "WAITING", "WAITING_FOR_RES",
                                            "PARTLY_FAILED", "POSTPONED", "OK", "FAILED", "CANCEL", "SKIPPED"],
                                           case_sensitive=False))
@click.option("--service")
@click.option("--operation")
@click.option("--route", help="service.operation (instead of --service and --operation).")
@click.option("--source-system")
@click.option("--correlation-id")
@click.option("--object-id")
@click.option("--parent-id", type=int)
@click.option("--from", "received_from", help="Received at or after (ISO 8601, UTC if no zone).")
@click.option("--to", "received_to", help="Received before (ISO 8601).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--cursor", type=int, help="Show messages older than this id (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_list(state: str | None, service: str | None, operation: str | None, route: str | None,
                  source_system: str | None, correlation_id: str | None, object_id: str | None,
                  parent_id: int | None, received_from: str | None, received_to: str | None, limit: int,
                  cursor: int | None, as_json: bool) -> None:
    """Messages matching every filter, newest first."""
    import openhub

    if route:
        if "." not in route:
            raise click.BadParameter("expected service.operation", param_hint="--route")
        service, operation = route.split(".", 1)
    views = openhub.list_messages(state=state.upper() if state else None, service=service, operation=operation,
                                  source_system=source_system, correlation_id=correlation_id, object_id=object_id,
                                  parent_id=parent_id, limit=limit, before_id=cursor,
                                  received_from=_timestamp(received_from, "--from"),
                                  received_to=_timestamp(received_to, "--to"))
    if as_json:
        click.echo(json.dumps([v.as_dict() for v in views], indent=2, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("id", "route", "state", "source", "correlation id", "object id", "fails", "received")
    for v in views:
        table.add_row(str(v.id), v.route, _state(v.state), v.source_system, v.correlation_id, v.object_id or "",
                      str(v.failed_count), v.received_at.strftime("%Y-%m-%d %H:%M:%S"))
    _console().print(table)
    if len(views) == limit:
        _console().print(f"[dim]more: --cursor {views[-1].id}[/dim]")


@messages.command("show")
@click.argument("message_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_show(message_id: int, as_json: bool) -> None:
    """One message with its external calls, history, children and confirmation."""
    from .api.detail import message_detail

    m = message_detail(message_id)
    if as_json:
        click.echo(json.dumps(m, indent=2, ensure_ascii=False))
        return
    from rich.table import Table

    console = _console()
    fields = Table(show_header=False, box=None)
    for name in ("id", "route", "state", "correlation_id", "source_system", "object_id", "process_id", "parent_id",
                 "failed_count", "failed_step", "received_at", "finished_at"):
        value = m.get(name)
        fields.add_row(name, _state(value) if name == "state" else ("" if value is None else str(value)))
    console.print(fields)
    console.print("[bold]payload[/bold]", json.dumps(m["payload"], indent=2, ensure_ascii=False), markup=True,
                  highlight=False)
    if m["failed_error"]:
        console.print("[bold]last error[/bold]", m["failed_error"].strip(), highlight=False)
    for title, rows, columns in (
            ("external calls", m["ext_calls"], ("step", "key", "state", "attempts", "duration_ms", "last_error")),
            ("history", m["history"], ("at", "event", "from_state", "to_state", "step", "detail")),
            ("children", m["children"], ("id", "route", "state", "object_id")),
            ("confirmation", m["confirmation"], ("outcome", "state", "attempts", "updated_at", "last_error"))):
        if not rows:
            continue
        table = Table(*columns, title=title, title_justify="left")
        for row in rows:
            table.add_row(*("" if row.get(c) is None else _short(str(row[c])) for c in columns))
        console.print(table)


@messages.command("restart")
@click.argument("message_id", type=int)
@click.option("--total", is_flag=True, help="Also forget OK external calls: every call is made again.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_restart(message_id: int, total: bool, as_json: bool) -> None:
    """Restart an OK, FAILED or CANCEL message."""
    import openhub

    _done(openhub.restart(message_id, total=total), "restarted", as_json)


@messages.command("cancel")
@click.argument("message_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_cancel(message_id: int, as_json: bool) -> None:
    """Cancel a message that is not final yet."""
    import openhub

    _done(openhub.cancel(message_id), "cancelled", as_json)


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
    click.echo(json.dumps({"route": route, "paused": False, "redriven": redriven}) if as_json
               else f"{route} resumed ({redriven} message(s) re-driven)")


DEMO_PAYLOADS = {
    "customer.setCustomer": lambda i: {"externalCustomerId": str(1000 + i % 7), "name": f"Demo customer {i}"},
    "order.create": lambda i: {"orderId": f"demo-{i}", "lines": [{"sku": 100 + i % 3, "qty": 1},
                                                                  {"sku": 200 + i % 2, "qty": 2}]},
}


@main.command()
@click.option("--count", default=20, show_default=True, type=click.IntRange(1, 1000), help="Messages to submit.")
@click.option("--timeout", default=300, show_default=True, type=float, help="Seconds to wait for final states.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary, no progress bar.")
def demo(count: int, timeout: float, as_json: bool) -> None:
    """Submit a batch to the example routes and follow it until every message is final.

    Run it next to `openhub dev` (or workers and beat): it shows a progress bar while the
    messages are carried, then a summary by route and state.
    """
    import openhub
    from .registry import get_registry
    from .states import FINAL

    routes = [r for r in DEMO_PAYLOADS if r in get_registry().routes]
    if not routes:
        raise click.ClickException(f"none of the example routes ({', '.join(DEMO_PAYLOADS)}) is loaded; "
                                   "run with OPENHUB_ROUTES=routes")
    run = uuid.uuid4().hex[:8]
    items = [dict(route=routes[i % len(routes)], payload=DEMO_PAYLOADS[routes[i % len(routes)]](i),
                  source_system="CRM", correlation_id=f"demo-{run}-{i}") for i in range(count)]
    ids = [v.id for v in openhub.submit_many(items)]
    started = time.monotonic()
    final = {s.value for s in FINAL}
    states = _states(ids)
    if as_json:
        while sum(s in final for s in states.values()) < len(ids) and time.monotonic() - started < timeout:
            time.sleep(0.5)
            states = _states(ids)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]demo[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=_console()) as progress:
            task = progress.add_task(f"{count} messages (run {run})", total=len(ids))
            while True:
                done = sum(s in final for s in states.values())
                progress.update(task, completed=done)
                if done == len(ids) or time.monotonic() - started > timeout:
                    break
                time.sleep(0.5)  # a CLI polling the store for the operator to watch
                states = _states(ids)
    summary: dict[tuple[str, str], int] = {}
    routes_by_id = dict(zip(ids, (i["route"] for i in items)))
    for message_id, state in states.items():
        key = (routes_by_id[message_id], state)
        summary[key] = summary.get(key, 0) + 1
    seconds = round(time.monotonic() - started, 1)
    finished = sum(s in final for s in states.values())
    if as_json:
        click.echo(json.dumps({"run": run, "submitted": len(ids), "final": finished, "seconds": seconds,
                               "by_route_and_state": [{"route": r, "state": s, "count": n}
                                                      for (r, s), n in sorted(summary.items())]}))
    else:
        from rich.table import Table

        table = Table("route", "state", "messages", title=f"demo {run}: {finished}/{len(ids)} final in {seconds} s")
        for (route, state), n in sorted(summary.items()):
            table.add_row(route, _state(state), str(n))
        _console().print(table)
        if finished < len(ids):
            _console().print("[yellow]not every message is final yet: is a worker running (openhub dev)?[/yellow]")
    if finished < len(ids):
        sys.exit(1)


def _timestamp(value: str | None, option: str) -> Any:
    """An ISO 8601 option as naive UTC; a clean usage error when it is not one."""
    from .producer import to_utc

    try:
        return to_utc(value, option)
    except OverflowError:
        raise click.BadParameter("out of range once converted to UTC", param_hint=option) from None


def _states(ids: list[int]) -> dict[int, str]:
    from sqlalchemy import select

    from .db import transaction
    from .schema import messages as table

    with transaction() as conn:
        return dict(conn.execute(select(table.c.id, table.c.state).where(table.c.id.in_(ids))).all())


def _console() -> Any:
    from rich.console import Console

    # Piped output keeps whole ids and routes instead of rich's 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=200)


_STATE_STYLE = {"OK": "green", "FAILED": "red", "PARTLY_FAILED": "yellow", "POSTPONED": "yellow", "CANCEL": "dim",
                "SKIPPED": "dim"}


def _state(state: Any) -> str:
    style = _STATE_STYLE.get(str(state))
    return f"[{style}]{state}[/{style}]" if style else str(state)


def _short(text: str, limit: int = 120) -> str:
    text = text.strip().splitlines()[-1] if text.strip() else text
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _done(view: Any, verb: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(view.as_dict(), ensure_ascii=False))
    else:
        click.echo(f"message {view.id} {verb}: now {view.state}")


def _safe(url: str) -> str:
    """A database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - printing only
        return url


try:  # the Spark pipeline is an optional extra
    from .pipeline.commands import archive, report

    main.add_command(report)
    main.add_command(archive)
except ImportError:
    pass
