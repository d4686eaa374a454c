"""One message of a batch (openhub.engine.batch): the step it is at, how far that step has come, and the runs
it has listed in this process's heartbeat."""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass, field

from openhub.core.runs import Entered, StepRun
from openhub.core.verdicts import StepReport, Verdict
from openhub.engine.engine import new_run

__all__ = ["Member", "skipped_or_stopped"]


@dataclass
class Member:
    """One message of the batch: the step it is at, and how far that step has come."""

    run: StepRun
    entered: Entered | bool | None = None  # None: its step is to be entered
    run_id: str | None = None  # the run id of the step to be entered (or handed over to)
    verdict: Verdict | None = None  # how its step ended; None: it did not run
    report: StepReport = field(default_factory=lambda: StepReport(True, "skipped"))
    done: bool = False
    listed: dict[str, ExitStack] = field(default_factory=dict)  # its runs listed in the heartbeat, by run id

    def new_run(self) -> str:
        """A new run id, listed in this process's heartbeat (before its lease is taken) until `unlist`."""
        stack = ExitStack()
        run_id = new_run(stack)
        self.listed[run_id] = stack
        return run_id

    def stop(self) -> None:
        """Its chain stops here (its message left to the lease repair, or to the lost-chain repair)."""
        self.done, self.report = True, skipped_or_stopped(False)

    def unlist(self, everything: bool = False) -> None:
        """End the listing of every run the member no longer holds a lease with (all, once it is done, or
        `everything` as the batch ends): called after a commit, never inside a transaction that may still
        roll back."""
        held: set[str | None] = set()
        if not (self.done or everything):
            held = {self.run_id, self.entered.run_id if isinstance(self.entered, Entered) else None}
        for run_id in [r for r in self.listed if r not in held]:
            self.listed.pop(run_id).close()

    def restore(self, saved: Member) -> None:
        """Back to the state `saved` (a copy), as a rolled-back transaction left it."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(saved, f.name))


def skipped_or_stopped(entered: bool) -> StepReport:
    """The report of a step `enter` did not run: done before (True), or the chain stops there (False)."""
    return StepReport(entered, "skipped" if entered else "stopped")
