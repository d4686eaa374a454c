"""`openhub messages`: search, inspect, restart and cancel messages, one by id or every one matching filters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from openhub.cli.inputs import json_given, json_input, timestamp
from openhub.cli.output import counted, echo_done, make_console, print_error, short, state_text, verbatim
from openhub.core.states import State
from openhub.store.queries import MessageFilter


@click.group()
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
def messages_list(
    state: str | None,
    service: str | None,
    operation: str | None,
    route: str | None,
    source_system: str | None,
    correlation_id: str | None,
    object_id: str | None,
    parent_id: int | None,
    error_code: str | None,
    process_id: str | None,
    received_from: str | None,
    received_to: str | None,
    limit: int,
    cursor: int | None,
    as_json: bool,
) -> None:
    """Messages matching every filter, newest first."""
    from openhub.api.summary import message_summaries
    from openhub.engine.hub import current

    filters = _filter_values(
        dict(
            state=state,
            service=service,
            operation=operation,
            route=route or None,
            source_system=source_system,
            correlation_id=correlation_id,
            object_id=object_id,
            parent_id=parent_id,
            error_code=error_code,
            process_id=process_id,
            received_from=received_from,
            received_to=received_to,
        )
    )
    items = message_summaries(current(), MessageFilter(**filters), limit, cursor)
    if as_json:
        click.echo(json.dumps(items, indent=2, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("id", "route", "state", "source", "correlation id", "object id", "fails", "received", "last error")
    for m in items:
        table.add_row(
            str(m["id"]),
            verbatim(m["route"]),
            state_text(m["state"]),
            verbatim(m["source_system"]),
            verbatim(m["correlation_id"]),
            verbatim(m["object_id"]),
            str(m["failed_count"]),
            m["received_at"][:19].replace("T", " "),
            verbatim(short(m["failed_error"] or "")),
        )
    make_console().print(table)
    if len(items) == limit:
        make_console().print(f"[dim]more: --cursor {items[-1]['id']}[/dim]")


@messages.command("show")
@click.argument("message_id", type=int)
@click.option("--verbose", "-v", is_flag=True, help="Each error's whole text (a traceback), not its one line.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the whole texts).")
def messages_show(message_id: int, verbose: bool, as_json: bool) -> None:
    """One message with its external calls, history, children and confirmation."""
    from openhub.api.detail import message_detail
    from openhub.engine.hub import current

    m = message_detail(current(), message_id)
    if as_json:
        click.echo(json.dumps(m, indent=2, ensure_ascii=False))
        return
    from rich.table import Table
    from rich.text import Text

    console = make_console()
    past = m["state"] == State.OK and bool(m["failed_error"])  # retried, then OK: the error is history
    fields = Table(show_header=False, box=None)
    for name in (
        "id",
        "route",
        "state",
        "correlation_id",
        "source_system",
        "object_id",
        "process_id",
        "parent_id",
        "failed_count",
        "failed_step",
        "received_at",
        "finished_at",
        "trace_id",
        "trace_url",
    ):
        value = m.get(name)
        label = "step_that_failed_earlier" if name == "failed_step" and past else name
        fields.add_row(label, state_text(value) if name == "state" else verbatim(value))
    console.print(fields)
    console.print("[bold]payload[/bold]")
    console.print(verbatim(json.dumps(m["payload"], indent=2, ensure_ascii=False)), highlight=False)
    more = False  # an error whose whole text says more than its line (a traceback): --verbose shows it
    if m["failed_error"]:
        console.print(
            "[bold]error of an earlier attempt[/bold] (the message then ended OK)"
            if past
            else "[bold]last error[/bold]"
        )
        more = print_error(console, m["failed_error_line"], m["failed_error"], verbose)
    for title, rows, columns in (
        ("external calls", m["ext_calls"], ("step", "key", "state", "attempts", "worker", "duration_ms", "last_error")),
        ("history", m["history"], ("at", "event", "from_state", "to_state", "step", "detail")),
        ("children", m["children"], ("id", "route", "state", "object_id")),
        ("confirmation", m["confirmation"], ("outcome", "state", "attempts", "updated_at", "last_error")),
    ):
        if not rows:
            continue
        table = Table(*columns, title=title, title_justify="left")
        for row in rows:
            table.add_row(*(verbatim(None if row.get(c) is None else short(str(row[c]))) for c in columns))
        console.print(table)
        for row in rows if "last_error" in columns else []:  # below its table, each whole text it cut
            if row["last_error"] and row["last_error"].strip() != row["last_error_line"]:
                more = True
                if verbose:
                    whose = f"step {row['step']}" if "step" in row else f"confirmation ({row['outcome']})"
                    console.print(verbatim(f"{whose}: last error", style="bold"), highlight=False)
                    console.print(verbatim(row["last_error"].strip()), highlight=False)
    for x in m.get("http_exchanges", []):
        # URL, error, headers and bodies come from the step and the external system: Text, never markup.
        outcome = str(x["status"]) if x["status"] is not None else f"no response: {x['error']}"
        console.print(
            Text.assemble(
                ("HTTP", "bold"),
                verbatim(
                    f" step {x['step']} attempt {x['attempt']}: {x['method']} {x['url']} -> "
                    f"{outcome} ({x['duration_ms']} ms, {x['at']})"
                ),
            ),
            highlight=False,
        )
        for label, headers, body in (
            ("request", x["request_headers"], x["request_body"]),
            ("response", x["response_headers"], x["response_body"]),
        ):
            lines = [f"  {k}: {v}" for k, v in headers.items()]
            if body:
                lines.append(f"  {body}")
            if lines:
                console.print(Text(f"  {label}", style="dim"), highlight=False)
                console.print(verbatim("\n".join(lines)), highlight=False)
    if more and not verbose:
        console.print(Text("each error is shown by its line: --verbose shows the whole texts", style="dim"))


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
    return _filters(
        click.option(
            "--limit",
            default=1000,
            show_default=True,
            type=click.IntRange(1, 1000),
            help="Act on at most this many (oldest first).",
        )(fn)
    )


def _filter_values(filters: dict[str, Any]) -> dict[str, Any]:
    """The options of `_filters` as keyword arguments of list_messages and the bulk actions."""
    values = dict(filters)
    route = values.pop("route")
    if route is not None:
        if "." not in route:
            raise click.BadParameter("expected service.operation", param_hint="--route")
        values["service"], values["operation"] = route.split(".", 1)
    values["state"] = values["state"].upper() if values["state"] else None
    values["received_from"] = timestamp(values["received_from"], "--from")
    values["received_to"] = timestamp(values["received_to"], "--to")
    return values


def _bulk(
    message_id: int | None,
    filters: dict[str, Any],
    one: Callable[[int], Any],
    many: Callable[..., Any],
    verb: str,
    as_json: bool,
) -> None:
    given = {k: v for k, v in filters.items() if v is not None and k != "limit"}
    if (message_id is None) == (not given):
        raise click.UsageError("give either one MESSAGE_ID or filters (--state, --route, --error-code, ...)")
    if message_id is not None:
        echo_done(one(message_id), verb, as_json)
        return
    result = many(**_filter_values(filters))
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(
        f"{counted(len(result.done), 'message')} {verb}"
        + (f"; {len(result.refused)} had moved on" if result.refused else "")
        + ("; more match: run again" if result.more else "")
    )
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
@click.option(
    "--from-step",
    help="With MESSAGE_ID: restart from this step of the route (its and the later steps' "
    "call records are cleared; the earlier steps are not called again).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_restart(message_id: int | None, total: bool, from_step: str | None, as_json: bool, **filters: Any) -> None:
    """Restart an OK, FAILED or CANCEL message, or every one matching the filters."""
    import openhub

    if from_step is not None:
        if message_id is None or total:
            raise click.UsageError("--from-step takes one MESSAGE_ID and no --total")
        echo_done(openhub.restart_from(message_id, from_step), f"restarted from step {from_step}", as_json)
        return
    _bulk(
        message_id,
        filters,
        lambda i: openhub.restart(i, total=total),
        lambda **f: openhub.restart_matching(total=total, **f),
        "restarted",
        as_json,
    )


@messages.command("cancel")
@click.argument("message_id", type=int, required=False)
@_matching
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_cancel(message_id: int | None, as_json: bool, **filters: Any) -> None:
    """Cancel a message that is not final yet, or every one matching the filters."""
    import openhub

    _bulk(message_id, filters, openhub.cancel, openhub.cancel_matching, "cancelled", as_json)


@messages.command("retry")
@click.argument("message_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_retry(message_id: int, as_json: bool) -> None:
    """Retry a PARTLY_FAILED or POSTPONED message now, not after its back-off (its failure count stays)."""
    import openhub

    echo_done(openhub.retry_now(message_id), "due now", as_json)


@messages.command("resubmit")
@click.argument("message_id", type=int)
@json_input("the new payload")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_resubmit(message_id: int, payload: str | None, payload_file: Path | None, as_json: bool) -> None:
    """Replace a FAILED message's payload (checked as a submission's; the old one stays in its history) and
    restart it from the step that failed."""
    import openhub

    echo_done(openhub.edit_payload(message_id, json_given(payload, payload_file)), "resubmitted", as_json)


@messages.command("respond")
@click.argument("message_id", type=int)
@json_input("the answer")
@click.option(
    "--token",
    "-t",
    help="The wait it answers: the ctx.wait_token its question gave (needed unless "
    "the message waits and no answer was ever taken for it).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def messages_respond(
    message_id: int, payload: str | None, payload_file: Path | None, token: str | None, as_json: bool
) -> None:
    """Deliver the answer MESSAGE_ID waits for (openhub.respond)."""
    import openhub

    data = json_given(payload, payload_file)
    view = openhub.respond(message_id, data, token=token, by="operator (CLI)")
    if as_json:
        click.echo(json.dumps({"id": view.id, "state": view.state, "duplicate": view.duplicate}))
    elif view.duplicate:
        click.echo(f"duplicate: message {view.id}'s wait {token} was answered already; this answer is not kept")
    else:
        click.echo(f"answered: message {view.id} ({view.state})")
