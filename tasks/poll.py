"""The poller task scheduled by beat, and the chain error callback."""

from __future__ import annotations

import logging

from openhub.celery.dispatch import CHAIN_FAILED_TASK, CONFIRM_TASK, POLL_TASK, celery_app
from openhub.core.errors import StepFailed
from openhub.engine import poller
from openhub.engine.hub import current
from openhub.outbound.confirm import send_confirmations
from openhub.store import workers
from openhub.store.queries import record_crash

from .steps import confirmer_deadline

log = logging.getLogger("openhub.tasks")
app = celery_app()


class _PollTicksAtDebug(logging.Filter):
    """Celery's INFO lines about each poller tick (beat sends it, the worker receives it, it succeeded)
    turned DEBUG: one tick a second made them most of the console and scrolled everything else away.
    A tick that did something says so itself (below); beat's first send stays INFO, to show it runs."""

    def __init__(self, keep_first: bool = False) -> None:
        super().__init__()
        self.keep_first = keep_first

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        about_poll = (isinstance(data, dict) and data.get("name") == POLL_TASK) or (
            isinstance(record.args, tuple) and POLL_TASK in record.args
        )
        if record.levelno != logging.INFO or not about_poll:
            return True
        if self.keep_first:
            self.keep_first = False
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


# request: "Discarding revoked task" for a tick that expired unrun behind a busy worker (by design).
for _name, _keep_first in (
    ("celery.beat", True),
    ("celery.worker.strategy", False),
    ("celery.app.trace", False),
    ("celery.worker.request", False),
):
    logging.getLogger(_name).addFilter(_PollTicksAtDebug(_keep_first))


# No task events: Flower's task list is for the steps of messages, and a tick a second made it mostly
# poller ticks. A tick that fails is still logged at ERROR by the worker.
@app.task(name=POLL_TASK, send_events=False)
def poll() -> dict:
    """One poller tick: re-drive due messages, repair expired leases, retry confirmations."""
    hub = current()
    workers.start_heartbeat(hub.settings)  # a poller's process is a witness of the others' heartbeats
    report = poller.tick(hub, confirm_deadline=confirmer_deadline())
    try:
        # What dead workers had taken and not started: back on the queue now, not after the visibility
        # timeout (the hub's lease grace would repair those messages later still).
        restored = hub.publisher.restore_orphans(report.dead_workers)
    except Exception as exc:
        log.warning("could not hand dead workers' deliveries back: %s", exc)
        restored = 0
    done = {
        "redriven": report.redriven,
        "repaired": report.repaired,
        "confirmations": report.confirmations,
        "expired": report.expired,
        "restored": restored,
    }
    log.log(
        logging.INFO if any(done.values()) else logging.DEBUG,
        "poller tick: re-drove %(redriven)s, repaired %(repaired)s, sent %(confirmations)s confirmations, "
        "expired %(expired)s, handed back %(restored)s deliveries",
        done,
    )
    return {**done, "seconds": round(report.seconds, 4)}


@app.task(name=CONFIRM_TASK)
def confirm(message_id: int) -> int:
    """Send a message's due confirmations and hook notifications (published after its final state);
    how many went out OK. A failed one is retried by the poller."""
    hub = current()
    hub.refresh()  # an admin's live settings, swapped in on the hub it sends by
    return send_confirmations(message_id, deadline=confirmer_deadline(), settings=hub.settings, registry=hub.registry)


@app.task(name=CHAIN_FAILED_TASK)
def chain_failed(request, exc, traceback, message_id: int, token: str) -> None:
    """A step task itself crashed (not the step: the engine records those); note it in the history.

    The message keeps its state: its lease expires and the poller repairs it as a lost chain.
    """
    if isinstance(exc, StepFailed):  # a failed attempt the engine recorded, shown as such in Flower
        return
    task = getattr(request, "task", "?")
    log.error(
        "message %s: task %s crashed outside the step (%r); the poller repairs it when its lease expires",
        message_id,
        task,
        exc,
    )
    try:
        record_crash(current().settings.database_url, message_id, f"{task}: {exc!r}")
    except Exception:
        log.exception("message %s: could not record the crash", message_id)
