"""The report as one self-contained HTML page: charts embedded as base64 PNG, tables, definitions.

Self-contained because the page is mailed around and opened from a file share: no scripts, no
stylesheets or images fetched from anywhere.
"""

from __future__ import annotations

import base64
import html
from datetime import datetime
from pathlib import Path
from typing import Any

from openhub.pipeline.charts import draw_charts
from openhub.pipeline.report import Report

SECTIONS = [
    # (chart key, table, heading, what the figures mean)
    (
        "counts",
        "counts",
        "Messages by source system, route and state",
        "Every message received in the range, in its current state.",
    ),
    ("sources", None, "Messages by source system", "The same counts summed per source system."),
    (
        "route_rates",
        "route_rates",
        "Failure and retry rates",
        (
            "failure rate = FAILED / messages in a final state; retry rate = messages that needed more "
            "than one attempt / messages."
        ),
    ),
    (
        "processing_time",
        "processing_time",
        "Processing time",
        "Seconds from received to a final state, exact percentiles; route * is all routes together.",
    ),
    (
        "throughput_hourly",
        "throughput_hourly",
        "Throughput per hour",
        "Messages received, and messages (of those received in the range) reaching a final state, per hour.",
    ),
    (
        "ext_call_failures",
        "ext_call_failures",
        "External calls per step",
        "failure rate = calls whose record ended FAILED / calls; attempts summed over calls.",
    ),
    (None, "slowest_routes", "Slowest routes", "The routes with the highest p95 processing time."),
    (
        "business_errors",
        "business_errors",
        "Business errors",
        "Codes recorded with ctx.business_error: occurrences and distinct messages.",
    ),
    (
        None,
        "http_statuses",
        "HTTP answers per step",
        "Exchanges recorded by HttpCall(record=True) per route, step and status (empty status: no response).",
    ),
]

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1000px; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: left; }
th { background: #f0f0f0; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.summary td { text-align: left; } img { max-width: 100%; } p.note { color: #555; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return html.escape(str(value))


def _table(rows: list[dict[str, Any]], table: str) -> str:
    if not rows:
        return f'<p class="note" data-table="{table}">No rows.</p>'
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)

    def td(value: Any) -> str:
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        return f'<td class="n">{_cell(value)}</td>' if numeric else f"<td>{_cell(value)}</td>"

    body = "".join("<tr>" + "".join(td(row[c]) for c in columns) + "</tr>" for row in rows)
    return f'<table data-table="{table}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _when(moment: datetime | None, default: str) -> str:
    return moment.isoformat(sep=" ") if moment else default


def render_page(report: Report) -> str:
    """The page's HTML text."""
    charts = draw_charts(report)
    total = report.total("messages")
    finished = sum(int(r["finished"] or 0) for r in report.tables.get("route_rates", []))
    failed = sum(int(r["failed"] or 0) for r in report.tables.get("route_rates", []))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>openhub message report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>openhub message report</h1>",
        '<table class="summary">',
        f"<tr><td>source</td><td>{html.escape(report.source)}</td></tr>",
        f"<tr><td>received from</td><td>{_when(report.start, 'the first message')}</td></tr>",
        f"<tr><td>received before</td><td>{_when(report.end, 'now')}</td></tr>",
        f"<tr><td>generated (UTC)</td><td>{report.generated_at.isoformat(sep=' ', timespec='seconds')}</td></tr>",
        f'<tr><td>messages</td><td id="total-messages">{total}</td></tr>',
        f"<tr><td>finished / failed</td><td>{finished} / {failed}</td></tr>",
        "</table>",
    ]
    for chart, table, heading, note in SECTIONS:
        parts.append(f'<h2>{html.escape(heading)}</h2><p class="note">{html.escape(note)}</p>')
        if chart is not None:
            data = base64.b64encode(charts[chart]).decode("ascii")
            parts.append(f'<img alt="{html.escape(heading)}" data-chart="{chart}" src="data:image/png;base64,{data}">')
        if table is not None:
            parts.append(_table(report.tables.get(table, []), table))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(report: Report, out: Path) -> Path:
    """Write the page as `out/report.html` and return its path."""
    path = out / "report.html"
    path.write_text(render_page(report), encoding="utf-8")
    return path
