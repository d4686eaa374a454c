"""What the heartbeats say (workers.py writes them): which processes are dead, and whether a step run
still runs. Pure judgement of heartbeat rows; "dead" needs a witness, as workers.py's module doc explains:
a process is dead only when another kept heartbeating without a break for the dead-after limit after its
last heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


def dead_among(rows: Iterable[Any], dead_after: timedelta) -> set[str]:
    """The ids of the processes that a witness saw fall silent for `dead_after` (see the module doc)."""
    rows = list(rows)
    dead = set()
    for silent in rows:
        for witness in rows:
            if witness.id != silent.id and witness.last_seen - max(witness.up_since, silent.last_seen) >= dead_after:
                dead.add(silent.id)
                break
    return dead


@dataclass(frozen=True)
class Liveness:
    """What the heartbeats say at one moment: which processes live, which are dead, what runs where."""

    alive: dict[str, Any]  # worker id -> its row
    dead: set[str]

    def run_in_flight(self, worker: str | None, step_run: str | None, leased_at: datetime) -> bool | None:
        """Whether a step run leased at `leased_at` by `worker` is still running (None: cannot tell).

        A live process whose heartbeat came after the run began lists the run if it still runs it.
        """
        if step_run is None or worker in self.dead:
            return False
        row = self.alive.get(worker or "")
        if row is None:
            return None
        runs = (row.runs or "").split(",")
        if step_run in runs:
            return True
        seen, number = runs[0][1:] if runs[0].startswith("#") else "", step_run.partition(".")[0]
        if seen.isdigit() and number.isdigit():  # both numbered: no clock is compared
            return int(number) > int(seen)
        return bool(row.last_seen <= leased_at)
