"""Group commit for single submissions: requests that arrive together are stored together.

Storing one message costs three short transactions and a broker publish; most of that cost is
per transaction, not per message (`openhub.submit_many` of 16 messages spends about a third of
the CPU per message that 16 `openhub.submit` calls do). So the ingress hands each accepted
request to an `AcceptBatcher`: when no flush is running the request is stored at once (no added
latency when traffic is light); requests that arrive while flushes are running wait for the
next flush and go into the store as one `submit_many`. Each request still gets its own answer:

- every item is checked on its own first (`producer.prepare_item`), so a bad payload is refused
  alone and never sinks the others of its batch, and the checked rows are what is stored;
- a store failure (StoreUnavailable) fails every request of the batch: nothing was stored;
- any other error of the batch is retried item by item, so it stays with the request that
  caused it.

The 202 is still sent only after the batch is committed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi.concurrency import run_in_threadpool

from openhub.core.context import MessageView
from openhub.core.errors import StoreUnavailable
from openhub.engine.hub import Hub
from openhub.service import messages as producer

log = logging.getLogger("openhub.api.batcher")


def store_items(hub: Hub, items: list[dict[str, Any]]) -> list[MessageView | BaseException]:
    """Store `items` (submit_many keyword dicts) in `hub` with one outcome per item, in order."""
    outcomes: list[MessageView | BaseException | None] = [None] * len(items)
    valid: list[int] = []
    rows: dict[int, dict[str, Any]] = {}
    now = hub.clock()
    for i, item in enumerate(items):
        try:
            rows[i] = producer.prepare_item(item, now, hub=hub)
            valid.append(i)
        except Exception as exc:
            outcomes[i] = exc
    if valid:
        try:
            for i, view in zip(valid, producer.store_new([rows[i] for i in valid], hub=hub)):
                outcomes[i] = view
        except StoreUnavailable as exc:
            for i in valid:
                outcomes[i] = exc
        except Exception:
            if len(valid) == 1:
                raise
            log.warning("a batch of %d submissions failed as a whole; storing them one by one", len(valid))
            for i in valid:
                try:
                    outcomes[i] = producer.store_new([rows[i]], hub=hub)[0]
                except Exception as exc:
                    outcomes[i] = exc
    return outcomes  # type: ignore[return-value]


class AcceptBatcher:
    """Collects concurrent submissions of one ingress process into `submit_many` calls to the hub it serves."""

    def __init__(self, hub: Hub, max_batch: int = 100, max_flushes: int = 2) -> None:
        self.hub = hub
        self.max_batch = max_batch
        self.max_flushes = max_flushes
        self.largest_batch = 0
        self._pending: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._flushes = 0
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, item: dict[str, Any]) -> MessageView:
        """Store one message (the keyword arguments of `submit_many`'s items); returns its view."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flushes < self.max_flushes:
            self._flushes += 1
            task = asyncio.ensure_future(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                self.largest_batch = max(self.largest_batch, len(batch))
                try:
                    outcomes = await run_in_threadpool(store_items, self.hub, [item for item, _ in batch])
                except asyncio.CancelledError:  # shutting down: the waiting requests end too
                    for _, future in batch:
                        future.cancel()
                    raise
                except Exception as exc:
                    outcomes = [exc] * len(batch)
                for (_, future), outcome in zip(batch, outcomes):
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._flushes -= 1
