"""The multi-host soak (issue 22): the rig of tests/support/hosts.py under a random fault schedule
for --minutes, then the checker of tests/support/history.py over the external system's log.

    sudo PYTHONPATH=. .venv/bin/python bench/hosts_soak.py --minutes 30 --seed 7

Prints one JSON line per run: the checker's summary, what it found, the faults injected (kind,
host, when, how long) and how long the hub took to settle once they stopped. Exit status 1 when the
checker found a broken promise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.support import hosts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=3.0, help="messages submitted a second")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(hosts.KINDS), help="fault kinds to draw from")
    args = parser.parse_args()
    why_not = hosts.available()
    if why_not:
        print(json.dumps({"skipped": why_not}))
        return 2
    with tempfile.TemporaryDirectory(prefix="openhub-hosts-soak-") as workdir:
        report, facts = hosts.chaos_run(
            Path(workdir),
            seed=args.seed,
            seconds=args.minutes * 60,
            rate=args.rate,
            kinds=args.kinds.split(","),
            hosts=args.hosts,
            settle=300,
        )
    kinds: dict[str, int] = {}
    for fault in facts["faults"]:
        kinds[fault["kind"]] = kinds.get(fault["kind"], 0) + 1
    print(json.dumps({"summary": report.summary(), "fault_counts": kinds, "facts": facts, "details": report.details()}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
