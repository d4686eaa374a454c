"""`openhub tokens` and `openhub audit`: the operators' named tokens and the audit trail.

Actions taken through the CLI are audited as the local user's (`local:<user>`, role admin): whoever
runs it holds the store's credentials.
"""

from __future__ import annotations

import json
from typing import Any

import click

from openhub.core.config import get_settings


@click.group()
def tokens() -> None:
    """Named operator tokens with a role each: viewer (reads), operator (actions), admin (tokens, configuration)."""


@tokens.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tokens_add(name: str, role: str, as_json: bool) -> None:
    """Make a token NAME with ROLE; its secret is printed this once (the store keeps its SHA-256 only)."""
    from openhub.store import tokens as store

    secret = store.add(name, role, url=get_settings().database_url)
    if as_json:
        click.echo(json.dumps({"name": name, "role": role, "token": secret}))
    else:
        click.echo(f"token {name} ({role}): {secret}\nkeep it now: it is not shown again")


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tokens_list(as_json: bool) -> None:
    """Every named token (never its secret)."""
    from openhub.store import tokens as store

    rows = store.listing(url=get_settings().database_url)
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        state = f"revoked {r['revoked_at'][:19]}" if r["revoked_at"] else "live"
        click.echo(f"{r['name']}\t{r['role']}\t{state}\tmade {r['created_at'][:19]} by {r['created_by']}")


@tokens.command("revoke")
@click.argument("name")
def tokens_revoke(name: str) -> None:
    """Revoke the token NAME: refused from now on (kept, so the audit still names it)."""
    from openhub.store import tokens as store

    store.revoke(name, url=get_settings().database_url)
    click.echo(f"token {name} revoked")


@click.command("audit")
@click.option("--who", help="The token's name (admin: OPENHUB_ADMIN_TOKEN; local:<user>: the CLI).")
@click.option("--action", help="e.g. message.restart, hub.drain, token.add.")
@click.option("--since", help="ISO 8601, inclusive (UTC if no zone).")
@click.option("--until", help="ISO 8601, exclusive.")
@click.option("--message-id", type=int, help="Entries naming this message.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def audit_command(
    who: str | None,
    action: str | None,
    since: str | None,
    until: str | None,
    message_id: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """The audit trail, newest first: who did what, to which messages or setting, from where."""
    from openhub.engine.intake import to_utc
    from openhub.store import audit

    rows = audit.entries(
        url=get_settings().database_url,
        who=who,
        action=action,
        since=to_utc(since, "--since"),
        until=to_utc(until, "--until"),
        message_id=message_id,
        limit=limit,
    )
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False))
        return
    for r in rows:
        click.echo(
            "  ".join(
                _plain(v)
                for v in (
                    r["at"][:19].replace("T", " "),
                    f"{r['who']} ({r['role']})",
                    r["action"],
                    r["target"] or "",
                    ",".join(map(str, r["message_ids"])),
                    _change(r),
                    r["client"] or "",
                    r["request_id"] or "",
                )
            )
        )


def _change(r: dict[str, Any]) -> str:
    if r["old_value"] is None and r["new_value"] is None:
        return ""
    return f"{r['old_value'] or '-'} -> {r['new_value'] or '-'}"


def _plain(value: Any) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


@click.group("breakers")
def breakers() -> None:
    """The external systems' circuit breakers: list, reset (close) or force open, with a reason (audited)."""


@breakers.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def breakers_list(as_json: bool) -> None:
    """Every system a step calls, with its breaker."""
    from openhub.service import breakers as operator

    rows = operator.breakers()
    if as_json:
        click.echo(json.dumps(rows))
        return
    for b in rows:
        state = f"open until {b['open_until'][:19]}" if b["open"] else "closed"
        click.echo(
            f"{_plain(b['system'])}\t{state}\t{b['failures']} failures in a row"
            + (f"\t{_plain(b['reason'])}" if b["reason"] else "")
        )


@breakers.command("reset")
@click.argument("system")
@click.option("--reason", required=True, help="Why (kept in the audit trail).")
def breakers_reset(system: str, reason: str) -> None:
    """Close SYSTEM's breaker: its failure count goes to 0."""
    from openhub.service import breakers as operator

    operator.reset_breaker(system, reason)
    click.echo(f"breaker of {system} closed")


@breakers.command("open")
@click.argument("system")
@click.option("--reason", required=True, help="Why (kept in the audit trail).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), help="How long (default OPENHUB_BREAKER_OPEN).")
def breakers_open(system: str, reason: str, seconds: float | None) -> None:
    """Force SYSTEM's breaker open: its steps are postponed (no failure counted) until the time is up."""
    from openhub.service import breakers as operator

    b = operator.open_breaker(system, reason, seconds)
    click.echo(f"breaker of {system} open until {b['open_until']}")
