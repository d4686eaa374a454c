"""The `openhub` command line (click)."""

from __future__ import annotations

import json
import sys

import click

from .config import get_settings


@click.group()
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
