"""`openhub config`: every setting in force and where it came from (secrets masked), on this process and on
the newest API, worker and beat process; `set` and `unset` change a live one on every process within one poll
interval, no restart.

Changes are audited as the local user's (`local:<user>`), as every CLI action is.
"""

from __future__ import annotations

import json
from typing import Any

import click

from openhub.cli.output import escaped


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help="Also the settings at their defaults.")
@click.pass_context
def config(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """The settings in force and their sources (default, environment, store); `set` / `unset` a live one."""
    if ctx.invoked_subcommand is not None:
        return
    from openhub.service import settings

    shown = settings.settings_in_force(kind="cli")
    if as_json:
        click.echo(json.dumps(shown))
        return
    click.echo("this process (openhub config):")
    _rows(shown["process"]["settings"], show_all)
    for snap in shown["processes"]:
        click.echo(f"\n{snap['kind']} process {escaped(snap['node'])}, as of {(snap['seen_at'] or '')[:19]}:")
        _rows(snap["settings"], show_all)
    for value in shown["values"]:
        by = escaped(value["set_by"] or "?")
        why = f": {escaped(value['reason'])}" if value["reason"] else ""
        click.echo(f"\nlive value {value['name']}={escaped(value['value'])} set by {by} at {value['set_at'][:19]}{why}")
    click.echo("\nchangeable at run time (openhub config set NAME VALUE): " + ", ".join(shown["live"]))


def _rows(rows: list[dict[str, Any]], show_all: bool) -> None:
    for row in rows:
        if show_all or row["source"] != "default" or row["live"]:
            live = "  (live)" if row["live"] else ""
            click.echo(f"  {row['name']}={escaped(row['value'])}\t[{row['source']}]{live}")


@config.command("set")
@click.argument("name")
@click.argument("value")
@click.option("--reason", help="Why (kept with the value, audited).")
def set_value(name: str, value: str, reason: str | None) -> None:
    """Keep VALUE for the live setting NAME: every process uses it within one poll interval."""
    from openhub.service import settings

    done = settings.set_setting(name, value, reason)
    click.echo(f"{done['name']}={escaped(done['value'])} (was {escaped(done['previous'] or 'not set in the store')})")


@config.command("unset")
@click.argument("name")
@click.option("--reason", help="Why (audited).")
def unset_value(name: str, reason: str | None) -> None:
    """Forget the live value of NAME: the environment's value or the default applies again."""
    from openhub.service import settings

    done = settings.unset_setting(name, reason)
    click.echo(f"{done['name']}={escaped(done['value'])} [{done['source']}] (was {escaped(done['previous'])})")
