"""`openhub demo`: a batch submitted to the example routes and followed until every message is final."""

from __future__ import annotations

import json
import sys
import time
import uuid

import click

from openhub.cli.output import make_console, state_text
from openhub.core.states import FINAL

DEMO_PAYLOADS = {
    "customer.setCustomer": lambda i: {"externalCustomerId": str(1000 + i % 7), "name": f"Demo customer {i}"},
    "order.create": lambda i: {
        "orderId": f"demo-{i}",
        "lines": [{"sku": 100 + i % 3, "qty": 1}, {"sku": 200 + i % 2, "qty": 2}],
    },
}


@click.command()
@click.option("--count", default=20, show_default=True, type=click.IntRange(1, 1000), help="Messages to submit.")
@click.option("--timeout", default=300, show_default=True, type=float, help="Seconds to wait for final states.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary, no progress bar.")
def demo(count: int, timeout: float, as_json: bool) -> None:
    """Submit a batch to the example routes and follow it until every message is final.

    Run it next to `openhub dev` (or workers and beat): it shows a progress bar while the
    messages are carried, then a summary by route and state.
    """
    import openhub
    from openhub.core.registry import get_registry

    routes = [r for r in DEMO_PAYLOADS if r in get_registry().routes]
    if not routes:
        raise click.ClickException(
            f"none of the example routes ({', '.join(DEMO_PAYLOADS)}) is loaded; run with OPENHUB_ROUTES=routes"
        )
    run = uuid.uuid4().hex[:8]
    items = [
        dict(
            route=routes[i % len(routes)],
            payload=DEMO_PAYLOADS[routes[i % len(routes)]](i),
            source_system="CRM",
            correlation_id=f"demo-{run}-{i}",
        )
        for i in range(count)
    ]
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

        with Progress(
            TextColumn("[bold]demo[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=make_console(),
        ) as progress:
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
        click.echo(
            json.dumps(
                {
                    "run": run,
                    "submitted": len(ids),
                    "final": finished,
                    "seconds": seconds,
                    "by_route_and_state": [
                        {"route": r, "state": s, "count": n} for (r, s), n in sorted(summary.items())
                    ],
                }
            )
        )
    else:
        from rich.table import Table

        table = Table("route", "state", "messages", title=f"demo {run}: {finished}/{len(ids)} final in {seconds} s")
        for (route, state), n in sorted(summary.items()):
            table.add_row(route, state_text(state), str(n))
        make_console().print(table)
        if finished < len(ids):
            make_console().print("[yellow]not every message is final yet: is a worker running (openhub dev)?[/yellow]")
    if finished < len(ids):
        sys.exit(1)


def _states(ids: list[int]) -> dict[int, str]:
    from sqlalchemy import select

    from openhub.engine.hub import current
    from openhub.store.schema import messages as table

    with current().transaction() as conn:
        return dict(conn.execute(select(table.c.id, table.c.state).where(table.c.id.in_(ids))).all())
