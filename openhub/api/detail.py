"""What an operator sees of one message: the view plus children, confirmations, history and HTTP exchanges."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from openhub.core.context import aware, error_line
from openhub.core.model import route_name
from openhub.core.secret_fields import mask_fields
from openhub.core.tracing import trace_url
from openhub.engine.hub import Hub
from openhub.store.audit import message_entries
from openhub.store.queries import message_view
from openhub.store.recordings import message_exchanges
from openhub.store.schema import confirmations, ext_calls, messages, transitions


def _iso(value: datetime | None) -> str | None:
    value = aware(value)
    return value.isoformat() if value is not None else None


def message_detail(hub: Hub, message_id: int) -> dict[str, Any]:
    """The message of `hub`'s store as `MessageView.as_dict()` (with `failed_error_line`, the one line shown of
    `failed_error`) with detailed ext calls, children, confirmation, history and the HTTP exchanges its steps recorded
    (`http_exchanges`, oldest first); the fields its route marks secret (`Route(secret_fields=...)`) are
    `[redacted]` in its payload."""
    with hub.transaction() as conn:
        view = message_view(conn, message_id)
        out = view.as_dict()
        out["failed_error_line"] = error_line(out["failed_error"])
        route = hub.registry.find_route_of(view)
        if route is not None and route.secret_fields:  # shown as [redacted]; the steps read the stored payload
            out["payload"] = mask_fields(out["payload"], route.secret_fields)
        X = ext_calls.c
        out["ext_calls"] = [
            {
                "key": c.key,
                "step": c.step_key,
                "scope": c.scope,
                "state": c.state,
                "attempts": c.attempts,
                "duration_ms": c.duration_ms,
                "updated_at": _iso(c.updated_at),
                "last_error": c.last_error,
                "last_error_line": error_line(c.last_error),
                "worker": c.worker,
            }
            for c in conn.execute(select(ext_calls).where(X.message_id == message_id).order_by(X.id))
        ]
        M = messages.c
        out["children"] = [
            {"id": r.id, "route": route_name(r.service, r.operation), "state": r.state, "object_id": r.object_id}
            for r in conn.execute(
                select(M.id, M.service, M.operation, M.state, M.object_id)
                .where(M.parent_id == message_id)
                .order_by(M.id)
            )
        ]
        C = confirmations.c
        out["confirmation"] = [
            {
                "id": r.id,
                "outcome": r.outcome,
                "state": r.state,
                "attempts": r.attempts,
                "hook": r.hook,
                "created_at": _iso(r.created_at),
                "updated_at": _iso(r.updated_at),
                "last_error": r.last_error,
                "last_error_line": error_line(r.last_error),
            }
            for r in conn.execute(select(confirmations).where(C.message_id == message_id).order_by(C.id))
        ]
        T = transitions.c
        out["history"] = [
            {
                "at": _iso(r.at),
                "event": r.event,
                "from_state": r.from_state,
                "to_state": r.to_state,
                "step": r.step_key,
                "detail": r.detail,
            }
            for r in conn.execute(select(transitions).where(T.message_id == message_id).order_by(T.id))
        ]
        out["http_exchanges"] = message_exchanges(conn, message_id)
        out["operator_actions"] = message_entries(conn, message_id)  # the audit entries naming it
    out["trace_url"] = trace_url(out["trace_id"], hub.settings.trace_url)
    return out


# What only operators see of a message: the hub's exchanges with external systems, what its steps keep for
# one another (custom_data: a token one step leaves for the next), and the link to its trace (the tracing
# back end's host, internal).
_OPERATORS_ONLY = frozenset({"http_exchanges", "custom_data", "trace_url", "operator_actions"})


def source_view(detail: dict[str, Any]) -> dict[str, Any]:
    """What a source system is shown of its own message (`message_detail` is the operators'): no
    recorded exchanges, custom data, trace link, tracebacks, worker names, history details or state
    hooks' notifications, and each error as one line. The hub's exchanges with external systems and
    its internals are not the source's business."""
    out = {k: v for k, v in detail.items() if k not in _OPERATORS_ONLY}
    out["failed_error"] = detail.get("failed_error_line")
    out["ext_calls"] = [
        {k: v for k, v in c.items() if k not in ("last_error", "worker")} for c in detail.get("ext_calls", [])
    ]
    out["confirmation"] = [
        {k: v for k, v in c.items() if k not in ("last_error", "hook")}
        for c in detail.get("confirmation", [])
        if c.get("hook") is None
    ]
    # A history detail names who answered, which message held a route back, what an operator did.
    out["history"] = [{k: v for k, v in h.items() if k != "detail"} for h in detail.get("history", [])]
    return out
