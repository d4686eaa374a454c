"""Run one chaos test again and again; how many runs passed, and the figure each run recorded.

    PYTHONPATH=. .venv/bin/python bench/chaos_loop.py [--runs 50] [--minutes 60]
        [-k holds_no_queued] [--property repair_seconds]

Each run is a fresh `pytest tests/chaos/test_faults.py -k K` (every parametrisation K selects: chain
and fused mode); the test records its figure with pytest's `record_property` and this script reads it
from the run's JUnit XML. It stops after --runs runs or --minutes minutes, whichever comes first, and
prints each run and the summary (passed/failed, min, median, max of the figure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(k: str, prop: str, xml: Path) -> tuple[dict[str, float | None], list[str], list[str], float]:
    """One pytest run: ({test id: figure, None when it failed}, failure texts, every property as
    name=value, seconds)."""
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/chaos/test_faults.py",
            "-k",
            k,
            f"--junitxml={xml}",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    figures: dict[str, float | None] = {}
    failures = []
    shown = []
    for case in ET.parse(xml).iter("testcase"):
        name = case.get("name", "?")
        shown += [f"{name}.{p.get('name')}={p.get('value')}" for p in case.iter("property")]
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            figures[name] = None
            failures.append(f"{name}: {(bad.get('message') or '')[:300]}")
            continue
        value = next((p.get("value") for p in case.iter("property") if p.get("name") == prop), None)
        figures[name] = float(value) if value is not None else None
    return figures, failures, shown, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("-k", default="holds_no_queued")
    parser.add_argument("--property", default="repair_seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.minutes * 60
    results: dict[str, list[float | None]] = {}  # test id -> its figure per run (None: failed, or none recorded)
    failed: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(1, args.runs + 1):
            if time.monotonic() > deadline:
                print(f"stopped after {n - 1} runs: --minutes {args.minutes:g} reached")
                break
            figures, failures, shown, seconds = one_run(args.k, args.property, Path(tmp) / f"run{n}.xml")
            for name, value in figures.items():
                results.setdefault(name, []).append(value)
            print(f"run {n}: {', '.join(shown)} ({seconds:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
            for text in failures:
                print(f"  FAILED {text}", flush=True)
                failed[text.split(":", 1)[0]] = failed.get(text.split(":", 1)[0], 0) + 1
    for name, values in results.items():
        passed = len(values) - failed.get(name, 0)
        ok = [v for v in values if v is not None]
        line = f"{name}: {passed} of {len(values)} passed"
        if ok:
            line += f"; {args.property} min {min(ok):.1f}, median {statistics.median(ok):.1f}, max {max(ok):.1f}"
        print(line)


if __name__ == "__main__":
    main()
