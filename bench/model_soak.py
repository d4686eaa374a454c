"""A long run of the promise's model-based test (tests/support/promise_model.py), not a CI test.

    PYTHONPATH=. .venv/bin/python bench/model_soak.py --rules 100000 [--steps 40] [--skip INVARIANT,...]

Runs the state machine example after example (each on a fresh LocalHub, up to `--steps` rules) until
`--rules` rules ran; prints examples, rules, time and the first failure, with hypothesis's minimal
example of it. Exit 1 on a failure. `--skip` turns invariants off, to hunt one kind of break past another
that is found first.
"""

from __future__ import annotations

import argparse
import sys
import time

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from tests.support import promise_model


class Counting(promise_model.PromiseMachine):
    """The machine, counting the rules it runs."""

    rules = 0
    examples = 0

    def __init__(self) -> None:
        super().__init__()
        Counting.examples += 1
        self.checked = False

    @invariant()
    def no_successful_call_made_twice(self) -> None:
        """The invariants run once after the machine starts and once after every rule: count those."""
        if self.checked:
            Counting.rules += 1
        self.checked = True
        super().no_successful_call_made_twice()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=40, help="rules per example at most")
    parser.add_argument("--skip", default="", help="invariants (method names) not to check, comma-separated")
    args = parser.parse_args()
    machine = type("Machine", (Counting,), {name: lambda self: None for name in filter(None, args.skip.split(","))})
    started = time.monotonic()
    batch = 200  # examples per hypothesis run; runs repeat until enough rules ran
    while Counting.rules < args.rules:
        config = settings(
            max_examples=batch,
            stateful_step_count=args.steps,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        try:
            run_state_machine_as_test(machine, settings=config)
        except Exception as exc:
            print(
                f"FAILED after {Counting.rules} rules in {Counting.examples} examples, "
                f"{time.monotonic() - started:.0f} s:"
            )
            for failure in getattr(exc, "exceptions", [exc]):  # hypothesis groups distinct failures
                print(f"{failure}\n" + "\n".join(getattr(failure, "__notes__", [])))
            return 1
        elapsed = time.monotonic() - started
        print(
            f"{Counting.rules} rules, {Counting.examples} examples, {elapsed:.0f} s "
            f"({Counting.rules / elapsed:.0f} rules/s), no failure",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
