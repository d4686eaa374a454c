"""The `openhub` command line (click), described in openhub/api/README.md ("Command line").

Every command that shows data takes `--json` for scripts and prints readable tables (rich)
otherwise. The commands call the same Python functions as the HTTP API (`openhub.submit`,
`openhub.restart`, ...); an openhub error ends the command with its message on stderr and exit
code 1, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import click

from .config import get_settings
from .errors import OpenHubError
from .states import FINAL, ConfirmationState, State


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
@click.option("--failure-rate", default=0.2, show_default=True, type=float,
              help="Share of simulated external calls that fail, to show retries.")
@click.option("--example-port", default=8765, show_default=True, type=int,
              help="Port of the simulated external systems (0: any free one).")
def dev(host: str, port: int, concurrency: int, failure_rate: float, example_port: int) -> None:
    """All in one on the embedded default: simulated external systems, worker, beat and ingress."""
    from .dev import run_dev
    from .migrate import upgrade

    upgrade()
    sys.exit(run_dev(host=host, port=port, concurrency=concurrency, failure_rate=failure_rate,
                     example_port=example_port))


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
    # Lines about a message carry its ids, as text or JSON (OPENHUB_LOG_FORMAT; openhub/logs.py); every line
    # is redacted (openhub/redact.py).
    log_config["filters"] = {"message_fields": {"()": "openhub.logs.MessageFields"},
                             "redacting": {"()": "openhub.logs.RedactingFilter"}}
    log_config["handlers"]["default"]["filters"] = ["message_fields", "redacting"]
    log_config["handlers"]["access"]["filters"] = ["redacting"]
    if get_settings().log_format == "json":
        log_config["formatters"]["default"] = {"()": "openhub.logs.JsonFormatter"}
    else:
        inner = DefaultFormatter(LOGGING_CONFIG["formatters"]["default"]["fmt"])
        log_config["formatters"]["default"] = {"()": "openhub.logs.TextFormatter", "inner": inner}
    from .api.server import uvicorn_options

    uvicorn.run("openhub.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, log_config=log_config, access_log=False, **uvicorn_options())


@main.command()
@click.argument("route")
@click.option("--source-system", "-s", required=True, help="The source system the message comes from.")
@click.option("--correlation-id", "-c", required=True, help="Unique per source system; a repeat is a duplicate.")
@click.option("--payload", "-p", help="The payload as JSON text.")
@click.option("--file", "-f", "payload_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file holding the JSON payload.")
@click.option("--process-id", help="Groups messages of one business process.")
@click.option("--msg-timestamp", help="ISO 8601 timestamp of the message (orders entity versions).")
@click.option("--expires-at", help="ISO 8601; not started by then, the message ends FAILED (error code EXPIRED).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def submit(route: str, source_system: str, correlation_id: str, payload: str | None, payload_file: Path | None,
           process_id: str | None, msg_timestamp: str | None, expires_at: str | None, as_json: bool) -> None:
    """Submit one message to ROUTE (service.operation)."""
    import openhub

    data = _json_given(payload, payload_file)
    _timestamp(msg_timestamp, "--msg-timestamp")
    _timestamp(expires_at, "--expires-at")
    view = openhub.submit(route, data, source_system=source_system, correlation_id=correlation_id,
                          process_id=process_id, msg_timestamp=msg_timestamp, expires_at=expires_at)
    summary = {"id": view.id, "correlation_id": view.correlation_id, "route": view.route, "state": view.state,
               "duplicate": view.duplicate}
    if as_json:
        click.echo(json.dumps(summary))
    elif view.duplicate:
        click.echo(f"duplicate: message {view.id} already has correlation id {view.correlation_id} ({view.state})")
    else:
        click.echo(f"accepted: message {view.id} ({view.route}, {view.state})")


def _json_given(payload: str | None, payload_file: Path | None) -> Any:
    """The JSON value given as --payload text or in a --file (exactly one of them)."""
    if (payload is None) == (payload_file is None):
        raise click.UsageError("give exactly one of --payload and --file")
    text = payload if payload is not None else payload_file.read_text(encoding="utf-8")  # type: ignore[union-attr]
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload/--file") from None


@main.group()
def messages() -> None:
    """Search, inspect, restart and cancel messages."""


@messages.command("list")
@click.option("--state", type=click.Choice(list(State), case_sensitive=False))
@click.option("--service")
@click.option("--operation")
@click.option("--route", help="service.operation (instead of --service and --operation).")
@click.option("--source-system")
@click.option("--correlation-id")
@click.option("--object-id")
@click.option("--parent-id", type=int)
@click.option("--error-code", help="The last failure's code (e.g. HTTP_422, TIMEOUT, WORKER_LOST).")
@click.option("--process-id", help="Messages of one business process.")
@click.option("--from", "received_from", help="Received at or after (ISO 8601, UTC if no zone).")
@click.option("--to", "received_to", help="Received before (ISO 8601).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--cursor", type=int, help="Show messages older than this id (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_list(state: str | None, service: str | None, operation: str | None, route: str | None,
                  source_system: str | None, correlation_id: str | None, object_id: str | None,
                  parent_id: int | None, error_code: str | None, process_id: str | None, received_from: str | None,
                  received_to: str | None, limit: int,
                  cursor: int | None, as_json: bool) -> None:
    """Messages matching every filter, newest first."""
    from .api.summary import message_summaries

    filters = _filter_values(dict(state=state, service=service, operation=operation, route=route or None,
                                  source_system=source_system, correlation_id=correlation_id, object_id=object_id,
                                  parent_id=parent_id, error_code=error_code, process_id=process_id,
                                  received_from=received_from, received_to=received_to))
    items = message_summaries(limit=limit, before_id=cursor, **filters)
    if as_json:
        click.echo(json.dumps(items, indent=2, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("id", "route", "state", "source", "correlation id", "object id", "fails", "received", "last error")
    for m in items:
        table.add_row(str(m["id"]), _verbatim(m["route"]), _state(m["state"]), _verbatim(m["source_system"]),
                      _verbatim(m["correlation_id"]), _verbatim(m["object_id"]), str(m["failed_count"]),
                      m["received_at"][:19].replace("T", " "), _verbatim(_short(m["failed_error"] or "")))
    _console().print(table)
    if len(items) == limit:
        _console().print(f"[dim]more: --cursor {items[-1]['id']}[/dim]")


@messages.command("show")
@click.argument("message_id", type=int)
@click.option("--verbose", "-v", is_flag=True, help="Each error's whole text (a traceback), not its one line.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the whole texts).")
def messages_show(message_id: int, verbose: bool, as_json: bool) -> None:
    """One message with its external calls, history, children and confirmation."""
    from .api.detail import message_detail

    m = message_detail(message_id)
    if as_json:
        click.echo(json.dumps(m, indent=2, ensure_ascii=False))
        return
    from rich.table import Table
    from rich.text import Text

    console = _console()
    past = m["state"] == State.OK and bool(m["failed_error"])  # retried, then OK: the error is history
    fields = Table(show_header=False, box=None)
    for name in ("id", "route", "state", "correlation_id", "source_system", "object_id", "process_id", "parent_id",
                 "failed_count", "failed_step", "received_at", "finished_at", "trace_id", "trace_url"):
        value = m.get(name)
        label = "step_that_failed_earlier" if name == "failed_step" and past else name
        fields.add_row(label, _state(value) if name == "state" else _verbatim(value))
    console.print(fields)
    console.print("[bold]payload[/bold]")
    console.print(_verbatim(json.dumps(m["payload"], indent=2, ensure_ascii=False)), highlight=False)
    more = False  # an error whose whole text says more than its line (a traceback): --verbose shows it
    if m["failed_error"]:
        console.print("[bold]error of an earlier attempt[/bold] (the message then ended OK)" if past
                      else "[bold]last error[/bold]")
        more = _error(console, m["failed_error_line"], m["failed_error"], verbose)
    for title, rows, columns in (
            ("external calls", m["ext_calls"], ("step", "key", "state", "attempts", "worker", "duration_ms",
                                                 "last_error")),
            ("history", m["history"], ("at", "event", "from_state", "to_state", "step", "detail")),
            ("children", m["children"], ("id", "route", "state", "object_id")),
            ("confirmation", m["confirmation"], ("outcome", "state", "attempts", "updated_at", "last_error"))):
        if not rows:
            continue
        table = Table(*columns, title=title, title_justify="left")
        for row in rows:
            table.add_row(*(_verbatim(None if row.get(c) is None else _short(str(row[c]))) for c in columns))
        console.print(table)
        for row in rows if "last_error" in columns else []:  # below its table, each whole text it cut
            if row["last_error"] and row["last_error"].strip() != row["last_error_line"]:
                more = True
                if verbose:
                    whose = f"step {row['step']}" if "step" in row else f"confirmation ({row['outcome']})"
                    console.print(_verbatim(f"{whose}: last error", style="bold"), highlight=False)
                    console.print(_verbatim(row["last_error"].strip()), highlight=False)
    for x in m.get("http_exchanges", []):
        # URL, error, headers and bodies come from the step and the external system: Text, never markup.
        outcome = str(x["status"]) if x["status"] is not None else f"no response: {x['error']}"
        console.print(Text.assemble(("HTTP", "bold"), _verbatim(
            f" step {x['step']} attempt {x['attempt']}: {x['method']} {x['url']} -> "
            f"{outcome} ({x['duration_ms']} ms, {x['at']})")), highlight=False)
        for label, headers, body in (("request", x["request_headers"], x["request_body"]),
                                     ("response", x["response_headers"], x["response_body"])):
            lines = [f"  {k}: {v}" for k, v in headers.items()]
            if body:
                lines.append(f"  {body}")
            if lines:
                console.print(Text(f"  {label}", style="dim"), highlight=False)
                console.print(_verbatim("\n".join(lines)), highlight=False)
    if more and not verbose:
        console.print(Text("each error is shown by its line: --verbose shows the whole texts", style="dim"))


@main.command()
@click.option("--watch", "watch", type=float, default=None, is_flag=False, flag_value=5.0,
              help="Redraw every N seconds (default 5) until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one JSON document per refresh).")
@click.option("--no-workers", is_flag=True, help="Do not ping the Celery workers (saves the half-second ping).")
def status(watch: float | None, as_json: bool, no_workers: bool) -> None:
    """The overview: live messages per route and state, throughput, failures, parked confirmations, workers."""
    from .overview import overview, workers

    def snapshot() -> dict[str, Any]:
        figures = overview()
        figures["workers"] = None if no_workers else workers(timeout=0.5)
        return figures

    if watch is None:
        figures = snapshot()
        click.echo(json.dumps(figures, ensure_ascii=False)) if as_json else _console().print(_status_view(figures))
        return
    if watch <= 0:
        raise click.BadParameter("must be a positive number of seconds", param_hint="--watch")
    try:
        if as_json:
            while True:
                click.echo(json.dumps(snapshot(), ensure_ascii=False))
                time.sleep(watch)
        console = _console()
        if not console.is_terminal:  # a pipe or a file: each refresh in full after the last (rich's Live
            while True:              # redraws in place, which writes nothing there until it ends)
                console.print(_status_view(snapshot()))
                console.print()
                sys.stdout.flush()
                time.sleep(watch)
        from rich.live import Live

        with Live(_status_view(snapshot()), console=console, screen=False, auto_refresh=False) as live:
            while True:
                time.sleep(watch)
                live.update(_status_view(snapshot()), refresh=True)
    except KeyboardInterrupt:
        pass


def _status_view(o: dict[str, Any]) -> Any:
    """The overview as rich renderables, one table per question."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    hour, day = o["finished"]["hour_total"], o["finished"]["day_total"]
    live = ", ".join(f"{_state(k)} {v}" for k, v in sorted(o["live_by_state"].items())) or "none"
    parts.append(f"[bold]openhub status[/bold] at {o['now']}\n"
                 f"finished last hour: {hour['finished']} ({hour['finished'] / 60:.2f}/min), "
                 f"failed {hour['failed']} ({hour['failure_rate']:.1%})\n"
                 f"finished last day:  {day['finished']} ({day['finished'] / 1440:.2f}/min), "
                 f"failed {day['failed']} ({day['failure_rate']:.1%})\n"
                 f"live messages: {live}")
    routes = Table("route", "state", "count", "oldest id", "oldest age", title="messages by route and state "
                   "(live states in full, final states finished in the last day)", title_justify="left")
    for r in o["routes"]:
        age = "" if r["oldest_age_seconds"] is None else _age(r["oldest_age_seconds"])
        routes.add_row(r["route"], _state(r["state"]), str(r["count"]),
                       "" if r["oldest_id"] is None else str(r["oldest_id"]), age)
    parts.append(routes if o["routes"] else "[dim]no messages live or finished in the last day[/dim]")
    c = o["confirmations"]
    parts.append(f"confirmations not OK: {', '.join(f'{k} {v}' for k, v in sorted(c['by_state'].items())) or 'none'}"
                 + (f"; parked (FAILED_END) messages: {', '.join(str(p['message_id']) for p in c['parked'])}"
                    if c["parked"] else ""))
    # Pause and drain reasons are operators' free text, worker names come from the broker: Text, not markup.
    paused = ", ".join(f"{p['route']} ({p['reason'] or 'no reason'})" for p in o["paused_routes"])
    parts.append(_verbatim(f"paused routes: {paused or 'none'}"))
    if o.get("open_breakers"):
        parts.append(_verbatim("circuit breakers open: " + ", ".join(f"{b['system']} (until {b['open_until'][11:19]})"
                                                                     for b in o["open_breakers"]), style="red"))
    if o.get("draining"):
        parts.append(_verbatim(f"draining ({o['draining']}): new messages are refused, none starts", style="yellow"))
    w = o.get("workers")
    if w is not None:
        parts.append(_verbatim(f"workers: {', '.join(w['workers']) or 'none answered'}" if w["available"]
                               else "workers: unknown (the broker could not be asked)"))
    return Group(*parts)


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@main.command()
@click.option("--reason", default="drained by an operator", show_default=True)
@click.option("--off", is_flag=True, help="End the drain: messages are taken again.")
@click.option("--status", "status_only", is_flag=True, help="Only tell whether the hub drains.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def drain(reason: str, off: bool, status_only: bool, as_json: bool) -> None:
    """Drain the hub before maintenance: new messages are refused, none starts, those under way finish."""
    from . import operator

    redriven = None
    if off:
        redriven = operator.undrain()
    elif not status_only:
        operator.drain(reason)
    state = operator.drain_status()
    if as_json:
        click.echo(json.dumps(state if redriven is None else {**state, "redriven": redriven}))
    elif state["draining"]:
        click.echo(f"draining ({_escaped(state['reason'])}): {_counted(state['under_way'], 'message')} still under way")
    else:
        click.echo("not draining" + (f"; {_counted(redriven, 'held-back message')} re-driven now"
                                     if redriven is not None else ""))


@main.group()
def confirmations() -> None:
    """What source systems were told; parked ones (FAILED_END) sent again."""


@confirmations.command("list")
@click.option("--state", type=click.Choice(list(ConfirmationState), case_sensitive=False),
              help="FAILED_END: parked, its attempts ran out.")
@click.option("--source-system")
@click.option("--message-id", type=int)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def confirmations_list(state: str | None, source_system: str | None, message_id: int | None, limit: int,
                       as_json: bool) -> None:
    """Confirmations, newest first."""
    from .confirm import list_confirmations
    from .context import aware, error_line

    rows = [{**r, "updated_at": aware(r["updated_at"]).isoformat(), "created_at": aware(r["created_at"]).isoformat(),
             "due_at": aware(r["due_at"]).isoformat() if r["due_at"] else None,
             "last_error": error_line(r["last_error"])}
            for r in list_confirmations(state=state.upper() if state else None, source_system=source_system,
                                        message_id=message_id, limit=limit)]
    if as_json:
        click.echo(json.dumps([{k: v for k, v in r.items() if k != "claim"} for r in rows], ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("id", "message", "to", "correlation id", "outcome", "state", "attempts", "updated", "last error")
    for r in rows:
        to = f"hook {r['hook']}" if r.get("hook") else r["source_system"]
        table.add_row(str(r["id"]), str(r["message_id"]), _verbatim(to), _verbatim(r["correlation_id"]),
                      r["outcome"], _state(r["state"]), str(r["attempts"]), r["updated_at"][:19].replace("T", " "),
                      _verbatim(r["last_error"]))
    _console().print(table)


@confirmations.command("resend")
@click.argument("confirmation_id", type=int, required=False)
@click.option("--parked", is_flag=True, help="Every parked (FAILED_END) confirmation.")
@click.option("--source-system", help="With --parked: only this source system's.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def confirmations_resend(confirmation_id: int | None, parked: bool, source_system: str | None, as_json: bool) -> None:
    """Send a parked confirmation again now, or (--parked) make every parked one due again."""
    from .confirm import resend, resend_parked

    if (confirmation_id is None) == (not parked):
        raise click.UsageError("give either one CONFIRMATION_ID or --parked")
    if confirmation_id is not None:
        row = resend(confirmation_id)
        click.echo(json.dumps({"id": row["id"], "state": row["state"]}) if as_json
                   else f"confirmation {row['id']} sent again: {row['state']}")
        return
    ids = resend_parked(source_system=source_system)
    click.echo(json.dumps({"resent": ids}) if as_json else f"{len(ids)} parked confirmations due again")


@main.group()
def exchanges() -> None:
    """HTTP requests and responses recorded by steps (HttpCall(record=True))."""


@exchanges.command("prune")
@click.option("--days", type=int, default=None, help="Keep this many days (default: OPENHUB_HTTP_RECORD_DAYS).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def exchanges_prune(days: int | None, as_json: bool) -> None:
    """Delete recorded HTTP exchanges older than the retention period."""
    from .exchanges import prune_exchanges

    deleted = prune_exchanges(days=days)
    click.echo(json.dumps({"deleted": deleted}) if as_json else f"{deleted} recorded HTTP exchanges deleted")


def _filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The message filters of `messages count` and of a bulk restart or cancel."""
    options = [
        click.option("--state", help="Only messages in this state."),
        click.option("--route", help="service.operation."),
        click.option("--source-system"),
        click.option("--error-code", help="The last failure's code (e.g. HTTP_503, EXPIRED)."),
        click.option("--process-id"),
        click.option("--from", "received_from", help="Received at or after (ISO 8601, UTC if no zone)."),
        click.option("--to", "received_to", help="Received before (ISO 8601)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _matching(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters of a bulk restart or cancel (instead of one MESSAGE_ID), and how many at most."""
    return _filters(click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000),
                                 help="Act on at most this many (oldest first).")(fn))


def _filter_values(filters: dict[str, Any]) -> dict[str, Any]:
    """The options of `_filters` as keyword arguments of list_messages and the bulk actions."""
    values = dict(filters)
    route = values.pop("route")
    if route is not None:
        if "." not in route:
            raise click.BadParameter("expected service.operation", param_hint="--route")
        values["service"], values["operation"] = route.split(".", 1)
    values["state"] = values["state"].upper() if values["state"] else None
    values["received_from"] = _timestamp(values["received_from"], "--from")
    values["received_to"] = _timestamp(values["received_to"], "--to")
    return values


def _bulk(message_id: int | None, filters: dict[str, Any], one: Callable[[int], Any],
          many: Callable[..., Any], verb: str, as_json: bool) -> None:
    given = {k: v for k, v in filters.items() if v is not None and k != "limit"}
    if (message_id is None) == (not given):
        raise click.UsageError("give either one MESSAGE_ID or filters (--state, --route, --error-code, ...)")
    if message_id is not None:
        _done(one(message_id), verb, as_json)
        return
    result = many(**_filter_values(filters))
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(f"{_counted(len(result.done), 'message')} {verb}"
               + (f"; {len(result.refused)} had moved on" if result.refused else "")
               + ("; more match: run again" if result.more else ""))
    for message_id, reason in result.refused.items():
        click.echo(f"  {message_id}: {reason}")


@messages.command("count")
@_filters
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_count(as_json: bool, **filters: Any) -> None:
    """How many messages match the filters."""
    import openhub

    total = openhub.count_messages(**_filter_values(filters))
    if as_json:
        click.echo(json.dumps({"total": total}))
    else:
        click.echo(f"{total} message matches" if total == 1 else f"{total} messages match")


@messages.command("restart")
@click.argument("message_id", type=int, required=False)
@_matching
@click.option("--total", is_flag=True, help="Also forget OK external calls: every call is made again.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_restart(message_id: int | None, total: bool, as_json: bool, **filters: Any) -> None:
    """Restart an OK, FAILED or CANCEL message, or every one matching the filters."""
    import openhub

    _bulk(message_id, filters, lambda i: openhub.restart(i, total=total),
          lambda **f: openhub.restart_matching(total=total, **f), "restarted", as_json)


@messages.command("cancel")
@click.argument("message_id", type=int, required=False)
@_matching
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_cancel(message_id: int | None, as_json: bool, **filters: Any) -> None:
    """Cancel a message that is not final yet, or every one matching the filters."""
    import openhub

    _bulk(message_id, filters, openhub.cancel, openhub.cancel_matching, "cancelled", as_json)


@messages.command("respond")
@click.argument("message_id", type=int)
@click.option("--payload", "-p", help="The answer as JSON text.")
@click.option("--file", "-f", "payload_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file holding the JSON answer.")
@click.option("--token", "-t", help="The wait it answers: the ctx.wait_token its question gave (needed unless "
                                    "the message waits and no answer was ever taken for it).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_respond(message_id: int, payload: str | None, payload_file: Path | None, token: str | None,
                     as_json: bool) -> None:
    """Deliver the answer MESSAGE_ID waits for (openhub.respond)."""
    import openhub

    data = _json_given(payload, payload_file)
    view = openhub.respond(message_id, data, token=token, by="operator (CLI)")
    if as_json:
        click.echo(json.dumps({"id": view.id, "state": view.state, "duplicate": view.duplicate}))
    elif view.duplicate:
        click.echo(f"duplicate: message {view.id}'s wait {token} was answered already; this answer is not kept")
    else:
        click.echo(f"answered: message {view.id} ({view.state})")


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
               else f"{route} resumed; {_counted(redriven, 'postponed message')} re-driven now")


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


_STATE_STYLE = {State.OK: "green", State.FAILED: "red", State.PARTLY_FAILED: "yellow", State.POSTPONED: "yellow",
                State.CANCEL: "dim", State.SKIPPED: "dim"}


def _state(state: Any) -> Any:
    from rich.text import Text

    return Text(str(state), style=_STATE_STYLE.get(str(state), ""))


# Control characters would move the cursor or recolour the terminal; they are shown escaped.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(value: Any) -> str:
    """Stored data as plain text with its control characters escaped (`\\x9b`), for click.echo."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _verbatim(value: Any, style: str = "") -> Any:
    """Stored data as a rich Text: printed as it is (never read as markup), control characters escaped."""
    from rich.text import Text

    return Text(_escaped(value), style=style)


def _short(text: str, limit: int = 120) -> str:
    from .context import error_line

    return error_line(text, limit) or ""


def _error(console: Any, line: str, whole: str, verbose: bool) -> bool:
    """Print an error as its line (with --verbose, its whole text); whether the whole text says more."""
    more = whole.strip() != line
    console.print(_verbatim(whole.strip() if verbose else line), highlight=False)
    return more


def _counted(n: int, noun: str) -> str:
    """`1 message`, `0 messages`, `2 messages`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


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
