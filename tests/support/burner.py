"""Run a command beside a CPU burner: the suite as it runs on a busy machine.

    python -m tests.support.burner --processes 4 -- make test

starts `--processes` processes that spin on the CPU (at the same priority as the command, so
they take their share of every core), runs the command, stops the spinners and exits with the
command's status. `make test-burn` runs the whole suite this way (`BURN=N` spinners, 4 by default:
twice the cores of the 2-core machine CI runs on). A test that fails only here asserts a time
bound a busy machine does not keep, or has found a race the quiet machine hides.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys


def spin() -> None:
    """Hold a core until killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the command's; the burner is stopped after it
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    """Start the spinners, run the command, stop them; the command's exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--processes",
        type=int,
        default=int(os.environ.get("BURN") or 4),
        help="spinning processes (default: $BURN, else 4)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(max(args.processes, 0))]
    for p in spinners:
        p.start()
    print(f"burner: {len(spinners)} spinning processes beside: {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.join()


if __name__ == "__main__":
    sys.exit(main())
