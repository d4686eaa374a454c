"""`openhub confirmations` (what source systems were told, parked ones sent again) and `openhub exchanges`
(the recorded HTTP exchanges of steps)."""

from __future__ import annotations

import json

import click

from openhub.cli.output import make_console, state_text, verbatim
from openhub.core.states import ConfirmationState


@click.group()
def confirmations() -> None:
    """What source systems were told; parked ones (FAILED_END) sent again."""


@confirmations.command("list")
@click.option(
    "--state",
    type=click.Choice(list(ConfirmationState), case_sensitive=False),
    help="FAILED_END: parked, its attempts ran out.",
)
@click.option("--source-system")
@click.option("--message-id", type=int)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def confirmations_list(
    state: str | None, source_system: str | None, message_id: int | None, limit: int, as_json: bool
) -> None:
    """Confirmations, newest first."""
    from openhub.core.context import aware, error_line
    from openhub.service.confirmations import list_confirmations

    rows = [
        {
            **r,
            "updated_at": aware(r["updated_at"]).isoformat(),
            "created_at": aware(r["created_at"]).isoformat(),
            "due_at": aware(r["due_at"]).isoformat() if r["due_at"] else None,
            "last_error": error_line(r["last_error"]),
        }
        for r in list_confirmations(
            state=state.upper() if state else None, source_system=source_system, message_id=message_id, limit=limit
        )
    ]
    if as_json:
        click.echo(json.dumps([{k: v for k, v in r.items() if k != "claim"} for r in rows], ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("id", "message", "to", "correlation id", "outcome", "state", "attempts", "updated", "last error")
    for r in rows:
        to = f"hook {r['hook']}" if r.get("hook") else r["source_system"]
        table.add_row(
            str(r["id"]),
            str(r["message_id"]),
            verbatim(to),
            verbatim(r["correlation_id"]),
            r["outcome"],
            state_text(r["state"]),
            str(r["attempts"]),
            r["updated_at"][:19].replace("T", " "),
            verbatim(r["last_error"]),
        )
    make_console().print(table)


@confirmations.command("resend")
@click.argument("confirmation_id", type=int, required=False)
@click.option("--parked", is_flag=True, help="Every parked (FAILED_END) confirmation.")
@click.option("--source-system", help="With --parked: only this source system's.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def confirmations_resend(confirmation_id: int | None, parked: bool, source_system: str | None, as_json: bool) -> None:
    """Send a parked confirmation again now, or (--parked) make every parked one due again."""
    from openhub.service.confirmations import resend, resend_parked

    if (confirmation_id is None) == (not parked):
        raise click.UsageError("give either one CONFIRMATION_ID or --parked")
    if confirmation_id is not None:
        row = resend(confirmation_id)
        click.echo(
            json.dumps({"id": row["id"], "state": row["state"]})
            if as_json
            else f"confirmation {row['id']} sent again: {row['state']}"
        )
        return
    ids = resend_parked(source_system=source_system)
    click.echo(json.dumps({"resent": ids}) if as_json else f"{len(ids)} parked confirmations due again")


@click.group()
def exchanges() -> None:
    """HTTP requests and responses recorded by steps (HttpCall(record=True))."""


@exchanges.command("prune")
@click.option("--days", type=int, default=None, help="Keep this many days (default: OPENHUB_HTTP_RECORD_DAYS).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def exchanges_prune(days: int | None, as_json: bool) -> None:
    """Delete recorded HTTP exchanges older than the retention period."""
    from openhub.core.config import get_settings
    from openhub.store.recordings import prune_exchanges

    deleted = prune_exchanges(get_settings(), days=days)
    click.echo(json.dumps({"deleted": deleted}) if as_json else f"{deleted} recorded HTTP exchanges deleted")
