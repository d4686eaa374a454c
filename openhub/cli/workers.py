"""`openhub workers`: each worker's state (taking work, finishing, stopped, store away, gone), and an
operator's "finish what you have, take nothing new" for one worker or every worker of a host, and back.

Actions are audited as the local user's (`local:<user>`), as every CLI action is.
"""

from __future__ import annotations

import json

import click

from openhub.cli.output import escaped


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """Each worker's state; `finish` / `resume` one worker (ID) or every worker of a host (--host)."""
    if ctx.invoked_subcommand is not None:
        return
    from openhub.service import worker_states

    rows, hosts = worker_states.worker_states(), worker_states.held_hosts()
    if as_json:
        click.echo(json.dumps({"workers": rows, "held_hosts": hosts}))
        return
    if not rows:
        click.echo("no worker has heartbeated in the store for a day")
    for w in rows:
        click.echo(
            "\t".join(
                [
                    w["id"],
                    escaped(w["node"]),
                    w["state"],
                    f"{w['in_flight']} in flight",
                    f"last seen {(w['last_seen'] or '')[:19]}",
                ]
                + ([f"held by {escaped(w['held_by'] or '?')}: {escaped(w['reason'] or '')}"] if w["held"] else [])
            )
        )
    for h in hosts:
        click.echo(f"host {escaped(h['host'])} held by {escaped(h['by'] or '?')}: {escaped(h['reason'] or '')}")


def _target(worker_id: str | None, host: str | None) -> None:
    if (worker_id is None) == (host is None):
        raise click.UsageError("name one worker (its ID, from `openhub workers`) or one --host")


@workers.command("finish")
@click.argument("worker_id", required=False)
@click.option("--host", help="Every worker of this host (also those started there later).")
@click.option("--reason", default="finish by an operator", show_default=True, help="Shown with it, audited.")
def finish(worker_id: str | None, host: str | None, reason: str) -> None:
    """Finish what it has and take nothing new (within one heartbeat), until `resume`."""
    from openhub.service import worker_states

    _target(worker_id, host)
    if host is not None:
        worker_states.finish_host(host, reason)
        click.echo(f"every worker of host {escaped(host)} finishes what it has and takes nothing new")
    else:
        worker_states.finish_worker(str(worker_id), reason)
        click.echo(f"worker {escaped(str(worker_id))} finishes what it has and takes nothing new")


@workers.command("resume")
@click.argument("worker_id", required=False)
@click.option("--host", help="Every worker of this host.")
def resume(worker_id: str | None, host: str | None) -> None:
    """Take work again (within one heartbeat)."""
    from openhub.service import worker_states

    _target(worker_id, host)
    if host is not None:
        worker_states.resume_host(host)
        click.echo(f"the workers of host {escaped(host)} take work again")
    else:
        worker_states.resume_worker(str(worker_id))
        click.echo(f"worker {escaped(str(worker_id))} takes work again")
