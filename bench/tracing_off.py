"""What tracing costs when it is off (issue 23): the hooks of openhub/core/tracing.py on the hot path.

    PYTHONPATH=. .venv/bin/python bench/tracing_off.py [--messages 300] [--runs 5]

Run with OTEL_TRACES_EXPORTER unset (tracing off). Two figures, both from this one process:

1. The hooks alone: ns per call of each off hook a message goes through (one submit, one chain
   published, one span per step, one per confirmation), summed per message of the 3-step route.
2. The engine with and without them, alternately in the same run: bench/engine.py's 3-step route
   (LocalHub over a fresh PostgreSQL database, one no-op HTTP call per step) as shipped (hooks off),
   against the same with every hook site rebound to a bare `nullcontext` constant, i.e. no tracing
   code at all. CPU ms per message of this process; the ratio shipped / stripped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine import one_run  # noqa: E402
from bench.throughput import noop_server  # noqa: E402


def hooks_ns() -> dict[str, float]:
    """ns per call of each off hook, best of 5 repeats of 200,000 calls."""
    from openhub.core import tracing

    rows = [{"service": "bench", "operation": "flow", "correlation_id": "c", "source_system": "S"}]
    message = SimpleNamespace(id=1, correlation_id="c")
    ctx = SimpleNamespace(message=message)

    def submit() -> None:
        with tracing.submitting(rows) as stored:
            stored([1])

    def publish() -> None:
        with tracing.continuing(None):
            pass

    def step() -> None:
        with tracing.step_span("bench.flow", "first", ctx, None) as traced:  # type: ignore[arg-type]
            traced.ended(None, None, None)

    def confirm() -> None:
        with tracing.message_span("confirm S", message, None, outcome="OK"):
            pass

    n = 200_000
    return {
        name: min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e9
        for name, fn in (("submit", submit), ("publish", publish), ("step", step), ("confirm", confirm))
    }


def strip_hooks() -> dict[str, object]:
    """Rebind every hook site to a bare nullcontext; returns what to restore."""
    from openhub.celery import dispatch
    from openhub.engine import engine, intake
    from openhub.outbound import confirm
    from openhub.service import messages as producer

    class Bare:
        def ended(self, *_: object) -> None:
            return None

    bare_step, bare = nullcontext(Bare()), nullcontext(lambda ids: None)
    saved = {
        "engine": engine.step_span,
        "dispatch": dispatch.continuing,
        "confirm": confirm.message_span,
        "producer": producer.tracing,
        "intake": intake.tracing,
    }
    engine.step_span = lambda *a, **k: bare_step  # type: ignore[assignment]
    dispatch.continuing = lambda *a, **k: bare  # type: ignore[assignment]
    confirm.message_span = lambda *a, **k: bare  # type: ignore[assignment]

    class NoTracing:
        @staticmethod
        def submitting(rows: object) -> object:
            return bare

        @staticmethod
        def valid(traceparent: object) -> object:
            return None

    producer.tracing = NoTracing  # type: ignore[assignment]
    intake.tracing = NoTracing  # type: ignore[assignment]
    return saved


def restore(saved: dict[str, object]) -> None:
    from openhub.celery import dispatch
    from openhub.engine import engine, intake
    from openhub.outbound import confirm
    from openhub.service import messages as producer

    engine.step_span = saved["engine"]  # type: ignore[assignment]
    dispatch.continuing = saved["dispatch"]  # type: ignore[assignment]
    confirm.message_span = saved["confirm"]  # type: ignore[assignment]
    producer.tracing = saved["producer"]  # type: ignore[assignment]
    intake.tracing = saved["intake"]  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from openhub.core import tracing

    assert not tracing.enabled(), "run with OTEL_TRACES_EXPORTER unset: this measures tracing off"
    ns = hooks_ns()
    per_message = ns["submit"] + ns["publish"] + 3 * ns["step"] + ns["confirm"]
    print(
        "off hooks, ns per call: "
        + ", ".join(f"{k} {v:.0f}" for k, v in ns.items())
        + f"; per message of 3 steps: {per_message:.0f} ns",
        flush=True,
    )
    http_port, server = noop_server()
    shipped: list[float] = []
    stripped: list[float] = []
    try:
        for k in range(args.runs):
            for variant, into in (
                (("shipped", shipped), ("stripped", stripped))
                if k % 2 == 0
                else (("stripped", stripped), ("shipped", shipped))
            ):
                saved = strip_hooks() if variant == "stripped" else None
                try:
                    result = one_run("bench.flow", args.messages, http_port)
                finally:
                    if saved is not None:
                        restore(saved)
                into.append(result["cpu_ms"])
                print(
                    f"run {k + 1} {variant}: cpu_ms/message={result['cpu_ms']:.3f} rate={result['rate']:.1f}/s",
                    flush=True,
                )
    finally:
        server.terminate()
    a, b = statistics.median(shipped), statistics.median(stripped)
    print(
        f"\nbench.flow, {args.messages} messages per run, {args.runs} runs each, alternated; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"  shipped (tracing off): {a:.3f} ms CPU/message ({min(shipped):.3f}-{max(shipped):.3f})")
    print(f"  stripped (no hooks):   {b:.3f} ms CPU/message ({min(stripped):.3f}-{max(stripped):.3f})")
    print(f"  ratio shipped/stripped: {a / b:.3f}; the hooks' own share: {per_message / (b * 1e6):.5f}")


if __name__ == "__main__":
    main()
