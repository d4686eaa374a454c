"""`openhub status`: the overview of the hub at a glance, once or redrawn (--watch)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from openhub.cli.output import make_console, state_text, verbatim


@click.command()
@click.option(
    "--watch",
    "watch",
    type=float,
    default=None,
    is_flag=False,
    flag_value=5.0,
    help="Redraw every N seconds (default 5) until Ctrl-C.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one JSON document per refresh).")
@click.option("--no-workers", is_flag=True, help="Do not ping the Celery workers (saves the half-second ping).")
def status(watch: float | None, as_json: bool, no_workers: bool) -> None:
    """The overview: live messages per route and state, throughput, failures, parked confirmations, workers."""
    from openhub.service.overview import overview, workers

    def snapshot() -> dict[str, Any]:
        figures = overview()
        figures["workers"] = None if no_workers else workers(timeout=0.5)
        return figures

    if watch is None:
        figures = snapshot()
        click.echo(json.dumps(figures, ensure_ascii=False)) if as_json else make_console().print(_status_view(figures))
        return
    if watch <= 0:
        raise click.BadParameter("must be a positive number of seconds", param_hint="--watch")
    try:
        if as_json:
            while True:
                click.echo(json.dumps(snapshot(), ensure_ascii=False))
                time.sleep(watch)
        console = make_console()
        if not console.is_terminal:  # a pipe or a file: each refresh in full after the last (rich's Live
            while True:  # redraws in place, which writes nothing there until it ends)
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
    live = ", ".join(f"{state_text(k)} {v}" for k, v in sorted(o["live_by_state"].items())) or "none"
    parts.append(
        f"[bold]openhub status[/bold] at {o['now']}\n"
        f"finished last hour: {hour['finished']} ({hour['finished'] / 60:.2f}/min), "
        f"failed {hour['failed']} ({hour['failure_rate']:.1%})\n"
        f"finished last day:  {day['finished']} ({day['finished'] / 1440:.2f}/min), "
        f"failed {day['failed']} ({day['failure_rate']:.1%})\n"
        f"live messages: {live}"
    )
    routes = Table(
        "route",
        "state",
        "count",
        "oldest id",
        "oldest age",
        title="messages by route and state (live states in full, final states finished in the last day)",
        title_justify="left",
    )
    for r in o["routes"]:
        age = "" if r["oldest_age_seconds"] is None else _age(r["oldest_age_seconds"])
        routes.add_row(
            r["route"],
            state_text(r["state"]),
            str(r["count"]),
            "" if r["oldest_id"] is None else str(r["oldest_id"]),
            age,
        )
    parts.append(routes if o["routes"] else "[dim]no messages live or finished in the last day[/dim]")
    c = o["confirmations"]
    parts.append(
        f"confirmations not OK: {', '.join(f'{k} {v}' for k, v in sorted(c['by_state'].items())) or 'none'}"
        + (
            f"; parked (FAILED_END) messages: {', '.join(str(p['message_id']) for p in c['parked'])}"
            if c["parked"]
            else ""
        )
    )
    # Pause and drain reasons are operators' free text, worker names come from the broker: Text, not markup.
    paused = ", ".join(f"{p['route']} ({p['reason'] or 'no reason'})" for p in o["paused_routes"])
    parts.append(verbatim(f"paused routes: {paused or 'none'}"))
    if o.get("open_breakers"):
        parts.append(
            verbatim(
                "circuit breakers open: "
                + ", ".join(f"{b['system']} (until {b['open_until'][11:19]})" for b in o["open_breakers"]),
                style="red",
            )
        )
    if o.get("draining"):
        held = "none starts" if o.get("drain_holds_retries", True) else "the stored ones go on"
        parts.append(verbatim(f"draining ({o['draining']}): new messages are refused, {held}", style="yellow"))
    w = o.get("workers")
    if w is not None:
        parts.append(
            verbatim(
                f"workers: {', '.join(w['workers']) or 'none answered'}"
                if w["available"]
                else "workers: unknown (the broker could not be asked)"
            )
        )
    return Group(*parts)


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
