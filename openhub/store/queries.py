"""Reading and writing messages: the SQL the producer, engine, poller and operators share."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cache
from typing import Any, Iterable, Sequence

from sqlalchemy import Connection, Row, bindparam, func, insert, literal, select, union_all, update

from openhub.core.context import ExtCallView, MessageView, aware
from openhub.core.errors import InputError, NotFound
from openhub.core.states import ConfirmationState, Event, Note, State
from openhub.store.db import insert_or_ignore, is_postgres, store_now, transaction
from openhub.store.schema import confirmations, ext_calls, messages, route_pauses, transitions

M = messages.c
# C0, DEL, C1 and the Unicode line/paragraph separators: in an id they forge log lines and break
# terminals. (`#`, the split children's separator, and markup-like text such as "[bold]" are allowed:
# readers print ids verbatim.) No stored id holds one, so no search filter may either.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# The hot path's statements are built once: building one costs several times more than running it.
# Parameters named after columns become the SET (or VALUES) columns when the statement is run.
_LOCK = {
    False: select(messages).where(M.id == bindparam("mid")),
    True: select(messages).where(M.id == bindparam("mid")).with_for_update(key_share=True),
}
_UPDATE = update(messages).where(M.id == bindparam("mid"))
# A history entry's columns and the parameters `history_entry` gives them.
_ENTRY = {
    "message_id": "mid",
    "at": "h_at",
    "event": "h_event",
    "from_state": "h_from",
    "to_state": "h_to",
    "step_key": "h_step",
    "detail": "h_detail",
}
_HISTORY = insert(transitions).values({column: bindparam(name) for column, name in _ENTRY.items()})


@cache
def _noted(statement: Any) -> Any:
    # The statement with a history entry as a data-modifying CTE, built once per statement.
    return statement.add_cte(_HISTORY.cte("history"))


def history_where(condition: Any) -> Any:
    """The history entry of `history_entry`'s parameters, inserted only where `condition` holds: a
    data-modifying CTE (PostgreSQL) whose entry depends on another CTE's write."""
    values = select(*(bindparam(name, type_=transitions.c[column].type) for column, name in _ENTRY.items()))
    return insert(transitions).from_select(list(_ENTRY), values.where(condition))


# The second entry of `history_pair_where`: its event, to-state and detail; the rest is the first entry's.
_SECOND = {"event": "e_event", "to_state": "e_to", "detail": "e_detail"}


def history_pair_where(condition: Any) -> Any:
    """Two history entries inserted only where `condition` holds, in this order (a data-modifying CTE): the first
    of `history_entry`'s parameters, the second at the same time for the same message and step, from the first's
    to-state, with its own event, to-state and detail (`second_entry`). PostgreSQL runs a statement's CTEs in no
    set order: one INSERT keeps the two in order."""
    first = {column: bindparam(name, type_=transitions.c[column].type) for column, name in _ENTRY.items()}
    second = {**first, "from_state": first["to_state"]}
    second.update({column: bindparam(name, type_=transitions.c[column].type) for column, name in _SECOND.items()})
    pair = union_all(
        select(*(v.label(c) for c, v in first.items()), literal(1).label("nth")).where(condition),
        select(*(v.label(c) for c, v in second.items()), literal(2).label("nth")).where(condition),
    ).subquery()
    return insert(transitions).from_select(list(_ENTRY), select(*(pair.c[c] for c in _ENTRY)).order_by(pair.c.nth))


def second_entry(event: str, to_state: str, detail: str | None = None) -> dict[str, Any]:
    """The parameters of `history_pair_where`'s second entry."""
    return {"e_event": event, "e_to": to_state, "e_detail": detail[:4000] if detail else None}


def execute_noted(conn: Connection, statement: Any, params: dict[str, Any], entry: dict[str, Any]) -> None:
    """Run `statement` (whose parameter `mid` is the message's id) and append the history entry `entry`
    (`history_entry`): on PostgreSQL in one round trip, the entry as a data-modifying CTE; SQLite has
    no such CTE and takes two statements."""
    if is_postgres(conn):
        conn.execute(_noted(statement), {**params, **entry})
    else:
        conn.execute(statement, params)
        conn.execute(_HISTORY, entry)


# A drain that refuses new messages only (`intake_only`) holds nothing back: not among the paused.
_PAUSED = select(route_pauses.c.route).where(route_pauses.c.intake_only.is_not(True))


def dumps(value: Any) -> str:
    """JSON text as the store keeps it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | None, default: Any = None) -> Any:
    """Parse JSON text from the store (None stays `default`)."""
    return default if text is None else json.loads(text)


def lock_message(conn: Connection, message_id: int) -> Row[Any] | None:
    """Read a message row, locking it for this transaction (SQLite's BEGIN IMMEDIATE already does).

    FOR NO KEY UPDATE, not FOR UPDATE: ids never change, and FOR UPDATE would conflict with the
    KEY SHARE lock a child's update takes on its parent through the parent_id foreign key, so two
    children finishing together and each locking the parent would deadlock.
    """
    return conn.execute(_LOCK[is_postgres(conn)], {"mid": message_id}).first()


def set_state(
    conn: Connection,
    row: Row[Any],
    event: str,
    state: State,
    *,
    step: str | None = None,
    detail: str | None = None,
    now: datetime,
    hooks: Sequence[str] = (),
    **values: Any,
) -> None:
    """Write a message's new state (and other columns) and append the transition to its history; each
    of `hooks`, the state hooks (@on_state) of the new state, gets its notification row in the same
    transaction where the state changes."""
    values.setdefault("updated_at", now)
    execute_noted(
        conn,
        _UPDATE,
        {"mid": row.id, "state": state.value, **values},
        history_entry(row.id, event, row.state, state.value, step=step, detail=detail, now=now),
    )
    hooks = hooks if row.state != state.value else ()
    if hooks:  # sent by the poller (or with the message's confirmation), retried like one
        conn.execute(
            insert(confirmations),
            [
                dict(
                    message_id=row.id,
                    outcome=state.value,
                    hook=name,
                    state=ConfirmationState.PENDING,
                    attempts=0,
                    due_at=now,
                    created_at=now,
                    updated_at=now,
                )
                for name in hooks
            ],
        )


def record_transition(
    conn: Connection,
    message_id: int,
    event: str,
    from_state: str | None,
    to_state: str,
    *,
    step: str | None = None,
    detail: str | None = None,
    now: datetime,
) -> None:
    """Append one entry to a message's history."""
    conn.execute(_HISTORY, history_entry(message_id, event, from_state, to_state, step=step, detail=detail, now=now))


def history_entry(
    message_id: int,
    event: str,
    from_state: str | None,
    to_state: str,
    *,
    step: str | None = None,
    detail: str | None = None,
    now: datetime,
) -> dict[str, Any]:
    """The parameters of one history entry (for `record_transition` and `execute_noted`)."""
    return {
        "mid": message_id,
        "h_at": now,
        "h_event": event,
        "h_from": from_state,
        "h_to": to_state,
        "h_step": step,
        "h_detail": detail[:4000] if detail else None,
    }


# What a run of a step that came back writes to the history (an operator's restart starts afresh too).
_RUN_CAME_BACK = tuple(
    e.value
    for e in (
        Note.STEP_OK,
        Event.TRANSIENT,
        Event.NO_EFFECT,
        Event.REJECTED,
        Event.HELD_BACK,
        Event.OBSOLETE,
        Event.SPLIT,
        Event.WAIT_RESPONSE,
        Event.COMPLETED,
        Event.RESTARTED,
    )
)


def runs_lost_in_a_row(conn: Connection, message_id: int) -> int:
    """How many runs of the message's steps in a row ended without an outcome (LEASE_EXPIRED), as its
    history shows: since the last run that came back with one, or an operator's restart."""
    T = transitions.c
    since = (
        select(func.coalesce(func.max(T.id), 0))
        .where(T.message_id == message_id, T.event.in_(_RUN_CAME_BACK))
        .scalar_subquery()
    )
    return conn.execute(
        select(func.count())
        .select_from(transitions)
        .where(T.message_id == message_id, T.event == Event.LEASE_EXPIRED.value, T.id > since)
    ).scalar_one()


def update_message(conn: Connection, message_id: int, **values: Any) -> None:
    """Write some columns of a message (no state change, no history)."""
    conn.execute(_UPDATE, {"mid": message_id, **values})


def record_crash(url: str, message_id: int, detail: str) -> None:
    """Note in a message's history, in the store at `url` (the caller's hub's), that a task carrying it
    crashed outside its step."""
    with transaction(url) as conn:
        state = conn.execute(select(M.state).where(M.id == message_id)).scalar()
        if state is not None:
            note = Note.TASK_CRASHED.value
            record_transition(conn, message_id, note, state, state, detail=detail, now=store_now(url))


DRAIN = "*"  # the route_pauses row of a drain: every route is paused and new messages are refused


def paused_routes(conn: Connection) -> set[str]:
    """Names of the routes an operator (or a Holdback) has paused; DRAIN among them while a drain holds back
    the messages stored (not while it only refuses new ones: `drain_reason` tells that one)."""
    return {r for (r,) in conn.execute(_PAUSED)}


def pause_route(conn: Connection, route: str, reason: str, now: datetime) -> None:
    """Pause a route (DRAIN: the whole hub); a pause already there keeps its reason."""
    conn.execute(_PAUSE[is_postgres(conn)], {"route": route, "paused_at": now, "reason": reason})


_PAUSE = {pg: insert_or_ignore(route_pauses, pg, index_elements=["route"]) for pg in (False, True)}


def is_paused(paused: set[str], route: str) -> bool:
    """Whether a route's messages may not start now: it is paused, or the hub is draining."""
    return route in paused or DRAIN in paused


def drain_reason(conn: Connection) -> str | None:
    """Why the hub is draining (None: it is not)."""
    return conn.execute(select(draining())).scalar()


def draining() -> Any:
    """Why the hub is draining (None: it is not), as a scalar subquery for other statements."""
    reason = func.coalesce(route_pauses.c.reason, "draining")
    return select(reason).where(route_pauses.c.route == DRAIN).scalar_subquery()


def view_of(row: Any, calls: Iterable[Row[Any]] = (), duplicate: bool = False) -> MessageView:
    return MessageView(
        id=row.id,
        correlation_id=row.correlation_id,
        source_system=row.source_system,
        service=row.service,
        operation=row.operation,
        object_id=row.object_id,
        entity_type=row.entity_type,
        process_id=row.process_id,
        failed_count=row.failed_count,
        received_at=aware(row.received_at),
        msg_timestamp=aware(row.msg_timestamp),
        parent_id=row.parent_id,
        state=row.state,
        payload=loads(row.payload),
        funnel=row.funnel,
        business_errors=loads(row.business_errors, []),
        custom_data=loads(row.custom_data, {}),
        failed_step=row.failed_step,
        failed_error=row.failed_error,
        finished_at=aware(row.finished_at),
        error_code=getattr(row, "error_code", None),
        expires_at=aware(getattr(row, "expires_at", None)),
        ext_calls=[ExtCallView(key=c.key, step=c.step_key, state=c.state, attempts=c.attempts) for c in calls],
        duplicate=duplicate,
        traceparent=getattr(row, "traceparent", None),
        result=loads(getattr(row, "result", None)),
        priority=getattr(row, "priority", 4),
    )


def message_view(conn: Connection, message_id: int, duplicate: bool = False) -> MessageView:
    """The message with its external calls, or NotFound."""
    row = conn.execute(select(messages).where(M.id == message_id)).first()
    if row is None:
        raise NotFound(f"no message with id {message_id}")
    calls = conn.execute(select(ext_calls).where(ext_calls.c.message_id == message_id).order_by(ext_calls.c.id))
    return view_of(row, calls, duplicate)


def refuse_control(**texts: Any) -> None:
    """InputError naming the first of `texts` (a filter's name and value) with a control character:
    PostgreSQL cannot even compare a NUL, so a search answers "bad filter" rather than failing in the driver."""
    for name, value in texts.items():
        if value is not None and CONTROL.search(str(value)):
            raise InputError(f"{name} must not contain control characters")


@dataclass(frozen=True)
class MessageFilter:
    """Which messages a search, a count or a bulk action means: every given field matches (None: any;
    `states`: any of these; `received_from` inclusive, `received_to` exclusive). The one object the
    command line, the HTTP API and the Python API hand down to the store.

    InputError for an unknown state or a text filter with a control character (PostgreSQL cannot
    even compare a NUL: a search must answer "bad filter", not fail in the driver).
    """

    state: str | None = None
    states: frozenset[str] | None = None
    service: str | None = None
    operation: str | None = None
    source_system: str | None = None
    correlation_id: str | None = None
    object_id: str | None = None
    parent_id: int | None = None
    error_code: str | None = None
    process_id: str | None = None
    received_from: datetime | None = None
    received_to: datetime | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in State.__members__:
            raise InputError(f"unknown state {self.state!r}")
        refuse_control(**{name: getattr(self, name) for name in _TEXT_FILTERS})

    def given(self) -> dict[str, Any]:
        """The fields that narrow the search, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def where(self, query: Any, before_id: int | None = None) -> Any:
        """`query` (over `messages`) narrowed to the matching messages; `before_id` pages on."""
        for name, value in self.given().items():
            if name == "states":
                query = query.where(M.state.in_(sorted(value)))
            elif name == "received_from":
                query = query.where(M.received_at >= value)
            elif name == "received_to":
                query = query.where(M.received_at < value)
            else:
                query = query.where(M[name] == value)
        return query if before_id is None else query.where(M.id < before_id)


_TEXT_FILTERS = ("service", "operation", "source_system", "correlation_id", "object_id", "error_code", "process_id")


def message_views(conn: Connection, matching: MessageFilter, limit: int = 100) -> list[MessageView]:
    """The messages `matching` means, newest first."""
    query = matching.where(select(messages))
    rows = conn.execute(query.order_by(M.id.desc()).limit(limit)).all()
    calls: dict[int, list[Row[Any]]] = {}
    if rows:
        ids = [r.id for r in rows]
        for c in conn.execute(select(ext_calls).where(ext_calls.c.message_id.in_(ids)).order_by(ext_calls.c.id)):
            calls.setdefault(c.message_id, []).append(c)
    return [view_of(r, calls.get(r.id, ())) for r in rows]
