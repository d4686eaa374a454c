"""The error-code catalogue as operators read it: every code, what it means, and how many stored
messages carry it (`openhub errors`, `GET /api/v1/errors`, the admin page).

The entries are the hub's own (openhub.core.codes) and the loaded routes' (`Route(errors=)`); a code found
on messages that neither describes (an exception's class name, a code a step computed and no route
declares) is listed too, flagged `declared: false`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from sqlalchemy import func, select

from openhub.core import codes
from openhub.engine.hub import Hub, given
from openhub.store.schema import messages

M = messages.c


def counts(*, hub: Hub | None = None) -> dict[str, int]:
    """Stored messages per last-failure code (the partial index on error_code serves it)."""
    with given(hub).transaction() as conn:
        rows = conn.execute(
            select(M.error_code, func.count()).where(M.error_code.is_not(None)).group_by(M.error_code)
        ).all()
    return {code: int(n) for code, n in rows}


def listing(with_counts: bool = True, *, hub: Hub | None = None) -> list[dict[str, Any]]:
    """Every entry, hub's first then the routes', then undeclared codes found on messages; each with
    `messages` (how many carry it; an HTTP family's sums its statuses) and `search`, the messages query."""
    hub = given(hub)
    declared = hub.registry.declared_codes()
    found = counts(hub=hub) if with_counts else {}
    entries = [*codes.hub_codes(), *sorted(declared.values(), key=lambda c: c.code)]
    rows: list[dict[str, Any]] = []
    for entry in entries:
        row = dict(entry.as_dict(), declared=True)
        if entry.code == codes.HTTP:
            statuses = {
                c: n
                for c, n in found.items()
                if codes.describe(c) is not None and c.startswith("HTTP_") and c not in codes.CATALOGUE
            }
            row.update(
                messages=sum(statuses.values()) if with_counts else None,
                statuses=dict(sorted(statuses.items())),
                search=None,
            )
        elif entry.code == codes.EXCEPTION:
            row.update(messages=None, search=None)
        else:
            row.update(messages=found.get(entry.code, 0) if with_counts else None, search=_search(entry.code))
        rows.append(row)
    for code, n in sorted(found.items()):
        if codes.describe(code, declared) is None:
            rows.append(
                dict(
                    code=code,
                    meaning="Not in the catalogue: an exception's class name, or a code a step "
                    "gives that its route does not declare.",
                    retried="depends",
                    action="Read a message's error; declare the code in its route's errors= if it is one.",
                    origin="found on messages",
                    declared=False,
                    messages=n,
                    search=_search(code),
                )
            )
    return rows


def _search(code: str) -> str:
    return f"/api/v1/messages?error_code={quote(code, safe='')}"
