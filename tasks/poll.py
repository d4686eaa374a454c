"""The poller task scheduled by beat, and the chain error callback."""

from __future__ import annotations

import logging

from openhub import poller, workers
from openhub.confirm import send_confirmations
from openhub.store import record_crash
from openhub.dispatch import CHAIN_FAILED_TASK, CONFIRM_TASK, POLL_TASK, celery_app, restore_orphans

log = logging.getLogger("openhub.tasks")
app = celery_app()


@app.task(name=POLL_TASK)
def poll() -> dict:
    """One poller tick: re-drive due messages, repair expired leases, retry confirmations."""
    workers.start_heartbeat()  # a poller's process is a witness of the others' heartbeats
    report = poller.tick()
    try:
        # What dead workers had taken and not started: back on the queue now, not after the visibility
        # timeout (the hub's lease grace would repair those messages later still).
        restored = restore_orphans(report.dead_workers)
    except Exception as exc:  # noqa: BLE001 - the broker is away: the next tick tries again
        log.warning("could not hand dead workers' deliveries back: %s", exc)
        restored = 0
    return {"redriven": report.redriven, "repaired": report.repaired, "confirmations": report.confirmations,
            "expired": report.expired, "restored": restored, "seconds": round(report.seconds, 4)}


@app.task(name=CONFIRM_TASK)
def confirm(message_id: int) -> int:
    """Send a message's due confirmations and hook notifications (published after its final state);
    how many went out OK. A failed one is retried by the poller."""
    return send_confirmations(message_id)


@app.task(name=CHAIN_FAILED_TASK)
def chain_failed(request, exc, traceback, message_id: int, token: str) -> None:  # noqa: ANN001
    """A step task itself crashed (not the step: the engine records those); note it in the history.

    The message keeps its state: its lease expires and the poller repairs it as a lost chain.
    """
    if type(exc).__name__ == "StepFailed":  # a failed attempt the engine recorded, shown as such in Flower
        return
    task = getattr(request, "task", "?")
    log.error("message %s: task %s crashed outside the step (%r); the poller repairs it when its lease expires",
              message_id, task, exc)
    try:
        record_crash(message_id, f"{task}: {exc!r}")
    except Exception:  # noqa: BLE001 - the store may be what failed; the lease still repairs the message
        log.exception("message %s: could not record the crash", message_id)
