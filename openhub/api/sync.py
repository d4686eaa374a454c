"""Synchronous routes over HTTP: the caller's request waits for the message to end, then gets its result.

A route declared `Route(..., sync=True)` is submitted as any other: stored, guarded, queued for the Celery
workers, which run its steps as for any message. The request then waits, bounded by the time it asks for
(`Prefer: wait=N`, RFC 7240; none asked: OPENHUB_SYNC_WAIT), at most OPENHUB_SYNC_MAX_WAIT;
`Prefer: respond-async` asks not to wait at all. Ended in time, the answer is the message with its
`result` (its last step's return value, stored on the message): 200 when OK, 422 when FAILED or cancelled
(with its error code). Past the time, the answer is the usual 202: the message goes on and ends once, as
every message does; its result is read later (`GET /api/v1/messages/{id}`) or by sending the same
correlation id again, which waits for the same message (a duplicate never runs it twice).

The wait holds no thread: the request's coroutine polls the message's state by primary key, each read a
short trip to the threadpool, backing off from 5 ms to 100 ms between reads (bench/sync_latency.py measures
what this adds to the steps' own time).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from openhub.core.config import Settings
from openhub.core.context import error_line
from openhub.core.states import FINAL, State
from openhub.engine.hub import Hub
from openhub.store.queries import loads
from openhub.store.schema import messages

M = messages.c
_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?(\d+(?:\.\d+)?)\"?", re.I)
FIRST_PAUSE, MAX_PAUSE, GROWTH = 0.005, 0.1, 1.5


def wait_seconds(prefer: str | None, settings: Settings) -> float:
    """How long to wait: what the caller's `Prefer` asks for (0 for respond-async), else OPENHUB_SYNC_WAIT;
    at most OPENHUB_SYNC_MAX_WAIT."""
    cap = settings.sync_max_wait.total_seconds()
    if prefer:
        if "respond-async" in prefer.lower():
            return 0.0
        match = _WAIT.search(prefer)
        if match:
            return min(float(match.group(1)), cap)
    return min(settings.sync_wait.total_seconds(), cap)


def _read(hub: Hub, message_id: int) -> Any:
    with hub.transaction() as conn:
        return conn.execute(select(M.state, M.result, M.error_code, M.failed_error).where(M.id == message_id)).first()


async def ended(hub: Hub, message_id: int, seconds: float) -> Any | None:
    """The message's row in `hub`'s store (state, result, error_code, failed_error) once it is final, or None
    when it is not final within `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    pause = FIRST_PAUSE
    while True:
        row = await run_in_threadpool(_read, hub, message_id)
        if row is not None and row.state in FINAL:
            return row
        left = deadline - loop.time()
        if left <= 0:
            return None
        await asyncio.sleep(min(pause, left))
        pause = min(pause * GROWTH, MAX_PAUSE)


def answer(accepted: dict[str, Any], row: Any) -> tuple[dict[str, Any], int]:
    """The body and status of a sync route's answer for a message that ended."""
    body = {**accepted, "state": row.state, "result": loads(row.result)}
    if row.state in (State.OK, State.SKIPPED):
        return body, 200
    return {**body, "error_code": row.error_code, "error": error_line(row.failed_error)}, 422
