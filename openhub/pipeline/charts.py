"""The report's charts as PNG bytes, drawn with matplotlib from the report's rows.

Figures are built with `matplotlib.figure.Figure` directly rather than pyplot: no global figure
state and no GUI backend, so a headless job (or a test run in parallel) cannot trip over either.
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

from openhub.core.states import State
from openhub.pipeline.report import Report

Rows = list[dict[str, Any]]
# One distinct colour per state, in the state machine's order, so a chart reads the same every time.
STATE_COLOURS = {
    State.NEW: "#90caf9",
    State.IN_QUEUE: "#1e88e5",
    State.PROCESSING: "#7e57c2",
    State.WAITING: "#26a69a",
    State.WAITING_FOR_RES: "#80deea",
    State.PARTLY_FAILED: "#fb8c00",
    State.POSTPONED: "#fdd835",
    State.OK: "#2e7d32",
    State.FAILED: "#c62828",
    State.CANCEL: "#6d4c41",
    State.SKIPPED: "#9e9e9e",
}


def _figure(height: float = 3.6):  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, height), dpi=90, layout="constrained")
    return fig, fig.subplots()


def _png(fig) -> bytes:  # type: ignore[no-untyped-def]
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _no_data(ax, title: str) -> None:  # type: ignore[no-untyped-def]
    ax.set_title(title)
    ax.text(0.5, 0.5, "no data in this range", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _height(n: int) -> float:
    return max(2.6, min(12.0, 0.9 + 0.32 * n))


def states_by_route(rows: Rows) -> bytes:
    """Stacked horizontal bars: messages per route, split by state."""
    per_route: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        per_route[row["route"]][row["state"]] += int(row["messages"])
    routes = sorted(per_route)
    fig, ax = _figure(_height(len(routes)))
    title = "Messages per route and state"
    if not routes:
        _no_data(ax, title)
        return _png(fig)
    seen = {s for counts in per_route.values() for s in counts}
    states = [s for s in STATE_COLOURS if s in seen] + sorted(seen - STATE_COLOURS.keys())
    left = [0] * len(routes)
    for state in states:
        values = [per_route[r].get(state, 0) for r in routes]
        ax.barh(routes, values, left=left, label=state, color=STATE_COLOURS.get(state))
        left = [a + b for a, b in zip(left, values)]
    ax.set_title(title)
    ax.set_xlabel("messages")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return _png(fig)


def messages_by_source(rows: Rows) -> bytes:
    """Bars: messages per source system."""
    totals: dict[str, int] = defaultdict(int)
    for row in rows:
        totals[row["source_system"]] += int(row["messages"])
    fig, ax = _figure(_height(len(totals)))
    title = "Messages per source system"
    if not totals:
        _no_data(ax, title)
        return _png(fig)
    names = sorted(totals)
    ax.barh(names, [totals[n] for n in names], color="#1565c0")
    ax.set_title(title)
    ax.set_xlabel("messages")
    return _png(fig)


def _grouped_bars(rows: Rows, label: str, series: list[tuple[str, str]], title: str, unit: str) -> bytes:
    fig, ax = _figure(_height(len(rows) * len(series) / 1.5))
    if not rows:
        _no_data(ax, title)
        return _png(fig)
    width = 0.8 / len(series)
    positions = range(len(rows))
    for i, (column, name) in enumerate(series):
        values = [float(row[column] or 0) for row in rows]
        ax.barh([p + i * width for p in positions], values, height=width, label=name)
    ax.set_yticks([p + width * (len(series) - 1) / 2 for p in positions], [str(row[label]) for row in rows])
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel(unit)
    ax.legend(loc="lower right", fontsize="small")
    return _png(fig)


def rates_by_route(rows: Rows) -> bytes:
    """Grouped bars: failure and retry rate per route."""
    return _grouped_bars(
        rows,
        "route",
        [("failure_rate", "failure rate"), ("retry_rate", "retry rate")],
        "Failure and retry rates per route",
        "share of messages",
    )


def processing_percentiles(rows: Rows) -> bytes:
    """Grouped bars: p50/p95/p99 processing time per route."""
    return _grouped_bars(
        rows,
        "route",
        [("p50_s", "p50"), ("p95_s", "p95"), ("p99_s", "p99")],
        "Processing time, received to final",
        "seconds",
    )


def throughput(rows: Rows) -> bytes:
    """Lines: messages received and finished per hour."""
    fig, ax = _figure()
    title = "Throughput per hour"
    if not rows:
        _no_data(ax, title)
        return _png(fig)
    hours = [row["hour"] for row in rows]
    ax.plot(hours, [row["received"] for row in rows], label="received", marker=".")
    ax.plot(hours, [row["finished"] for row in rows], label="finished", marker=".")
    ax.set_title(title)
    ax.set_ylabel("messages per hour")
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    return _png(fig)


def ext_call_failure_rates(rows: Rows) -> bytes:
    """Bars: failure rate of each route's external-call step."""
    fig, ax = _figure(_height(len(rows)))
    title = "External-call failure rate per step"
    if not rows:
        _no_data(ax, title)
        return _png(fig)
    labels = [f"{row['route']} / {row['step_key']}" for row in rows]
    ax.barh(labels, [float(row["failure_rate"] or 0) for row in rows], color="#ef6c00")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel("failed calls / calls")
    return _png(fig)


def business_error_codes(rows: Rows) -> bytes:
    """Bars: occurrences of each business-error code."""
    fig, ax = _figure(_height(len(rows)))
    title = "Business errors by code"
    if not rows:
        _no_data(ax, title)
        return _png(fig)
    ax.barh([str(row["code"]) for row in rows], [int(row["occurrences"]) for row in rows], color="#6a1b9a")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel("occurrences")
    return _png(fig)


def draw_charts(report: Report) -> dict[str, bytes]:
    """Every chart of the report, keyed by the table it illustrates."""
    t = report.tables
    return {
        "counts": states_by_route(t.get("counts", [])),
        "sources": messages_by_source(t.get("counts", [])),
        "route_rates": rates_by_route(t.get("route_rates", [])),
        "processing_time": processing_percentiles([r for r in t.get("processing_time", []) if r["route"] != "*"]),
        "throughput_hourly": throughput(t.get("throughput_hourly", [])),
        "ext_call_failures": ext_call_failure_rates(t.get("ext_call_failures", [])),
        "business_errors": business_error_codes(t.get("business_errors", [])),
    }
