"""A store with known traffic, written row by row, for the overview's tests (API, CLI, browser).

The expected figures are spelled out in `EXPECTED`, so a test compares the overview with numbers
a person can check against the rows below, not with the overview's own queries.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from openhub.core.config import reset_settings
from openhub.store.db import dispose_engines
from openhub.store.migrate import upgrade
from openhub.store.schema import confirmations, http_exchanges, messages, route_pauses
from tests.support.process_store import transaction

# route, state, received (minutes ago), finished (minutes ago or None), how many
TRAFFIC = [
    ("customer.setCustomer", "OK", 6, 5, 6),
    ("customer.setCustomer", "FAILED", 7, 5, 2),
    ("customer.setCustomer", "OK", 181, 180, 4),  # in the day, not the hour
    ("customer.setCustomer", "OK", 2 * 1440, 2 * 1440 - 1, 3),  # older than a day: not counted
    ("customer.setCustomer", "PARTLY_FAILED", 30, None, 1),
    ("customer.setCustomer", "PARTLY_FAILED", 10, None, 1),
    ("customer.setCustomer", "NEW", 2, None, 1),
    ("order.create", "WAITING", 20, None, 1),
    ("order.create", "OK", 2, 1, 3),
]

EXPECTED = {
    "hour_finished": 11,
    "hour_failed": 2,
    "day_finished": 15,
    "day_failed": 2,
    "live": {"PARTLY_FAILED": 2, "NEW": 1, "WAITING": 1},
    "counts": {
        ("customer.setCustomer", "OK"): 10,
        ("customer.setCustomer", "FAILED"): 2,
        ("customer.setCustomer", "PARTLY_FAILED"): 2,
        ("customer.setCustomer", "NEW"): 1,
        ("order.create", "WAITING"): 1,
        ("order.create", "OK"): 3,
    },
    "oldest_partly_failed_minutes": 30,
    "parked": 2,
    "pending_confirmations": 1,
    "paused": ["order.bookLine"],
    "parked_error": "HTTP 500 from https://crm.example/confirmations",  # the line of PARKED_ERROR
}

# What a parked confirmation keeps of a confirmer that called raise_for_status(): a traceback whose last
# line sends the reader to developer.mozilla.org (issue 40: the overview listed all of it).
PARKED_ERROR = """Traceback (most recent call last):
  File "/srv/routes/customers.py", line 61, in confirm_crm
    httpx.post(CRM_CONFIRM, json=outcome.as_dict()).raise_for_status()
  File "/srv/.venv/lib/python3.11/site-packages/httpx/_models.py", line 829, in raise_for_status
    raise HTTPStatusError(message, request=request, response=self)
httpx.HTTPStatusError: Server error '500 Internal Server Error' for url 'https://crm.example/confirmations'
For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/500
"""


def _row(route: str, state: str, received: datetime, finished: datetime | None) -> dict[str, Any]:
    service, operation = route.split(".")
    return {
        "source_system": "CRM",
        "correlation_id": f"known-{uuid.uuid4().hex}",
        "process_id": None,
        "service": service,
        "operation": operation,
        "object_id": "42",
        "entity_type": operation,
        "funnel": None,
        "parent_id": None,
        "payload": json.dumps({"externalCustomerId": "42"}),
        "state": state,
        "failed_count": 1 if state in ("FAILED", "PARTLY_FAILED") else 0,
        "attempt_id": None,
        "step_run": None,
        "due_at": None if finished else received + timedelta(hours=1),
        "received_at": received,
        "msg_timestamp": received,
        "started_at": received,
        "updated_at": finished or received,
        "finished_at": finished,
        "attempts": 1,
        "generation": 0,
        "custom_data": None,
        "business_errors": None,
        "response": None,
        "failed_step": "update_billing" if state in ("FAILED", "PARTLY_FAILED") else None,
        "failed_error": "TransientError: POST /billing answered 503" if state in ("FAILED", "PARTLY_FAILED") else None,
    }


def write_known_traffic(now: datetime, url: str | None = None) -> dict[str, Any]:
    """Insert TRAFFIC relative to `now` (naive UTC); returns ids: oldest PARTLY_FAILED, a FAILED message."""
    ids: dict[str, Any] = {"failed": []}
    with transaction(url) as conn:
        for route, state, received, finished, count in TRAFFIC:
            for _ in range(count):
                row = _row(
                    route,
                    state,
                    now - timedelta(minutes=received),
                    now - timedelta(minutes=finished) if finished is not None else None,
                )
                mid = conn.execute(insert(messages).values(**row).returning(messages.c.id)).scalar_one()
                if state == "PARTLY_FAILED" and received == 30:
                    ids["oldest_partly_failed"] = mid
                if state == "FAILED":
                    ids["failed"].append(mid)
        for mid in ids["failed"]:
            conn.execute(
                insert(confirmations).values(
                    message_id=mid,
                    outcome="FAILED",
                    state="FAILED_END",
                    attempts=3,
                    due_at=None,
                    created_at=now,
                    updated_at=now,
                    last_error=PARKED_ERROR,
                )
            )
        conn.execute(
            insert(confirmations).values(
                message_id=ids["oldest_partly_failed"],
                outcome="OK",
                state="PENDING",
                attempts=0,
                due_at=now,
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(insert(route_pauses).values(route="order.bookLine", paused_at=now, reason="warehouse closed"))
        # One recorded exchange, for the detail page's HTTP section.
        conn.execute(
            insert(http_exchanges).values(
                message_id=ids["oldest_partly_failed"],
                step_key="update_billing",
                attempt=1,
                method="POST",
                url="http://billing.example/customers",
                status=503,
                error=None,
                request_headers=json.dumps(
                    {"idempotency-key": "CRM/known/update_billing", "authorization": "[redacted]"}
                ),
                request_body='{"externalCustomerId": "42"}',
                response_headers=json.dumps({"retry-after": "5"}),
                response_body="billing is down",
                duration_ms=42,
                at=now - timedelta(minutes=30),
            )
        )
    return ids


@contextmanager
def fresh_store(kind: str, directory: Path) -> Iterator[str]:
    """A new, migrated store ("sqlite" or "postgresql") made the process's OPENHUB_DATABASE_URL."""
    from tests.support.backends import postgres_database

    saved = os.environ.get("OPENHUB_DATABASE_URL")

    def use(url: str) -> str:
        os.environ["OPENHUB_DATABASE_URL"] = url
        reset_settings()
        dispose_engines()
        upgrade(url)
        return url

    try:
        if kind == "sqlite":
            yield use(f"sqlite:///{directory / 'store.db'}")
        else:
            with postgres_database("openhub_overview") as url:
                yield use(url)
    finally:
        dispose_engines()
        if saved is None:
            os.environ.pop("OPENHUB_DATABASE_URL", None)
        else:
            os.environ["OPENHUB_DATABASE_URL"] = saved
        reset_settings()
