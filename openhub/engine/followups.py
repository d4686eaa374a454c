"""After commit: carrying out what committed writes asked for.

Every writer of message state (openhub.engine.lifecycle) returns its follow-ups as data; `carry_out`
is the one place that does them once the transaction committed: send the queued confirmations,
publish the children of a split and the chains of re-dispatched messages, let a funnel's next
message go, re-drive the messages made due now (the due scan, openhub.engine.due). Each has a
backstop in the store if this process dies first: the poller finds the confirmation, the due
message and the NEW child on its own.
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import partial
from typing import Any, Callable

from openhub.engine.due import scan_due_messages
from openhub.engine.funnel import release_funnel
from openhub.engine.hub import Hub
from openhub.engine.lifecycle import FollowUps
from openhub.engine.split import dispatch_children
from openhub.outbound.confirm import send_confirmations

log = logging.getLogger("openhub.redrive")


def carry_out(hub: Hub, follow: FollowUps, now: datetime) -> None:
    """Do what committed writes asked for in `hub` (at time `now`, the time they were written at).

    A follow-up that fails is logged and left to the poller's backstop; the others still run.
    """
    publisher = hub.publisher
    if follow.chains:
        publisher.publish_many(follow.chains)  # a refused publish is re-driven by the poller
    for message_id in follow.confirm:  # sent by their own task: a slow receiver must not hold this one
        try:
            published = publisher.publish_confirmation(message_id)
        except Exception:
            log.exception("message %s: could not publish its confirmation; the poller sends it", message_id)
            continue
        if not published:  # LocalHub: no Celery, sent here
            _attempt(
                message_id,
                "send its confirmation",
                partial(send_confirmations, settings=hub.settings, registry=hub.registry),
                message_id,
            )
    for message_id in follow.children:
        _attempt(message_id, "publish its children", dispatch_children, hub, message_id)
    due = list(follow.redrive)
    for message_id in follow.funnels:
        nxt = _attempt(message_id, "release its funnel", release_funnel, hub, message_id, now)
        if nxt is not None:
            due.append(nxt)
    if due:
        _attempt(due[0], "re-drive", redrive_due_messages, hub, now, due)


def _attempt(message_id: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        log.exception("message %s: could not %s after commit; the poller takes over", message_id, what)
        return None


def redrive_due_messages(hub: Hub, now: datetime, only_ids: list[int] | None = None) -> tuple[int, int]:
    """Publish new chains for due messages and fail over those whose lease expired (the due scan,
    `openhub.engine.due.scan_due_messages`), then carry out what that committed asked for.

    Returns (re-driven, repaired): PARTLY_FAILED/POSTPONED/unpublished NEW messages get a new
    chain, and so do IN_QUEUE messages and chains between steps that no task took in time (no
    failure counted), unless the broker shows their task still waiting in its queue (a backlog: their
    time is extended); a step whose lease ran out is extended while its worker lives and is re-driven
    otherwise (a run lost, no failure counted); WAITING_FOR_RES messages past their timeout count a failure.
    It lives here, not in openhub.engine.due, because `carry_out` re-drives too: the scan stays below both.
    """
    follow = FollowUps()
    counts = scan_due_messages(hub, now, follow, only_ids)
    carry_out(hub, follow, now)
    return counts
