"""Does the model test guard? Each fix of the promise reverted in turn, and the CI model test run on it.

    PYTHONPATH=. .venv/bin/python bench/mutations.py [--only NAME[,NAME...]] [--jobs 2] [--no-record]

For each mutation of `tests/support/mutations.py`: the tree (this checkout's files, as they are now,
uncommitted edits included; never .git, .venv or var) is copied to a temporary directory, the break is
put back there, and the CI configuration of the model tests runs in that copy: the same pytest command
and arguments as `make test` (`-q -p no:cacheprovider`), on the same files, whose hypothesis settings
are fixed in them (derandomized, a fixed budget). Caught: that pytest failed. The table is printed and
appended, with the command, to bench/RESULTS.md. Exit 1 when a mutation was not caught.

The working tree is never changed.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.mutations import MUTATIONS, Mutation  # noqa: E402

# The CI configuration of the model tests: `make test`'s PYTEST_ARGS, these files (the regression examples
# first, seconds, so that a mutation they catch stops there: `-x`; then the model's part with real workers,
# about two minutes, which reaches what no LocalHub can; then the random search).
MODEL_TESTS = [
    "tests/integration/test_promise_regressions.py",
    "tests/integration/test_promise_process_model.py",
    "tests/integration/test_promise_model.py",
]
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-x"]
IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "var", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "*.pyc"
)


@dataclass
class Result:
    mutation: Mutation
    caught: bool
    seconds: float
    detail: str  # the first failing test (caught), or why the run itself went wrong
    guard: str = ""  # with --guards, for a mutation the model tests let through: what its own test said


def run_one(mutation: Mutation, timeout: float, guards: bool = False, tests: list[str] | None = None) -> Result:
    """`run_tests`, and where the model tests let the break through and `guards`, its own test too."""
    result = run_tests(mutation, timeout, tests or MODEL_TESTS)
    if guards and not result.caught and mutation.guard.startswith("tests/"):
        own = run_tests(mutation, timeout, [mutation.guard])
        result.guard = f"{'caught' if own.caught else 'NOT caught'} by {mutation.guard.split('::')[-1]}"
    return result


def run_tests(mutation: Mutation, timeout: float, tests: list[str]) -> Result:
    """Copy the tree, put the break back, run the model tests there."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation.name}-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(ROOT, copy, ignore=IGNORE)
        mutation.apply(copy)
        files = [f for f in tests if (copy / f.split("::")[0]).exists()]
        command = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *files]
        env = {**_environ(), "PYTHONPATH": str(copy)}
        try:
            done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(mutation, True, time.monotonic() - started, f"timed out after {timeout:.0f} s (a hang)")
        out = done.stdout + done.stderr
        failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
        if "Timeout (>" in out:  # pytest-timeout: too slow on this machine, not a verdict on the break
            return Result(mutation, False, time.monotonic() - started, "INCONCLUSIVE: pytest-timeout")
        if done.returncode == 0:
            detail = ""
        elif done.returncode == 1 and failed:
            detail = failed[0].split(" - ")[0].replace("FAILED ", "")
        else:  # not a test's failure: a crash of the run (import error, ...)
            detail = f"pytest exit {done.returncode}: {out.strip().splitlines()[-1] if out.strip() else ''}"
        return Result(mutation, done.returncode != 0, time.monotonic() - started, detail)


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def table(results: list[Result]) -> str:
    lines = [
        "| mutation | break it re-introduces | file | model can reach | caught | time | failing test | "
        "its own test (--guards) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.mutation
        lines.append(
            f"| {m.name} | {m.issue} | {m.file} | {'yes' if m.model else 'no'} | "
            f"{'**caught**' if r.caught else 'NOT caught'} | {r.seconds:.0f} s | {r.detail or '-'} | "
            f"{r.guard or '-'} |"
        )
    caught = sum(r.caught for r in results)
    lines.append("")
    lines.append(f"{caught} of {len(results)} caught.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="mutation names, comma-separated (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at once (the machine's cores: 2 at most)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for one mutation's run")
    parser.add_argument(
        "--guards",
        action="store_true",
        help="where the model tests let a break through, run its own test (Mutation.guard) too",
    )
    parser.add_argument(
        "--tests",
        default="",
        help="test files instead of the model tests, comma-separated "
        "(e.g. tests/integration/test_promise_model.py: what the random search alone catches)",
    )
    parser.add_argument("--no-record", action="store_true", help="do not append the table to bench/RESULTS.md")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutations: {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    tests = [f for f in args.tests.split(",") if f] or MODEL_TESTS
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = []
        for result in pool.map(lambda m: run_one(m, args.timeout, args.guards, tests), chosen):
            print(
                f"{result.mutation.name}: {'caught' if result.caught else 'NOT caught'} in {result.seconds:.0f} s"
                f" {result.detail}",
                flush=True,
            )
            results.append(result)
    text = table(results)
    print(text)
    if not args.no_record:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        command = "PYTHONPATH=. .venv/bin/python bench/mutations.py " + shlex.join(sys.argv[1:])
        with open(ROOT / "bench" / "RESULTS.md", "a") as out:
            out.write(
                f"\n### Mutations run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {head}\n\n"
                f"`{command.strip()}` ({time.monotonic() - started:.0f} s in all; each runs "
                f"`pytest {' '.join(PYTEST_ARGS)} {' '.join(tests)}` in a copy of the tree)\n\n"
                f"{text}\n"
            )
    return 0 if all(r.caught for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
