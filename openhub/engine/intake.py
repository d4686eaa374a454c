"""A new message stored NEW and its chain published after commit: the checks that turn one message into
the columns of a NEW row (`prepare`), its insertion with its accepted entry (`insert_new_many`), and the
publishing of its chain (`publish_new`). Both the producer (openhub.service.messages) and a split's
children (openhub.engine.split) take this one way in, so a child is checked and stored as a message is."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from functools import cache
from typing import Any, Iterable

import pydantic
from sqlalchemy import ARRAY, Connection, String, Text, bindparam, func, insert, literal, select

from openhub.core import tracing
from openhub.core.config import Settings
from openhub.core.errors import Draining, InputError, PayloadTooLarge, SourceNotAllowed
from openhub.core.model import Route, route_name
from openhub.core.policy import handover_due
from openhub.core.states import Note, State
from openhub.engine.hub import Hub, given
from openhub.store.db import database_now, insert_or_ignore, is_postgres
from openhub.store.queries import CONTROL, M, drain_reason, draining, dumps
from openhub.store.schema import messages, transitions

MAX_ID_LENGTH = 255
MAX_CHILD_ID = 320  # a split child's correlation id: its parent's plus "#generation.n"


def identifier(value: Any, what: str, limit: int = MAX_ID_LENGTH, required: bool = True) -> str | None:
    """An id given by a caller (correlation id, process id, source system): text without control characters."""
    text = _text(value, what, limit, required)
    if text is not None and CONTROL.search(text):
        raise InputError(f"{what} must not contain control characters")
    return text


def _text(value: Any, what: str, limit: int = MAX_ID_LENGTH, required: bool = True) -> str | None:
    if value is None or value == "":
        if required:
            raise InputError(f"{what} is required")
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InputError(f"{what} must be a string, got {type(value).__name__}")
    value = str(value)
    if len(value) > limit:
        raise InputError(f"{what} is longer than {limit} characters")
    return value


def to_utc(value: datetime | str | None, what: str = "msg_timestamp") -> datetime | None:
    """A timestamp (datetime or ISO 8601 text) as naive UTC; naive input is taken as UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"{what} is not an ISO 8601 timestamp: {value!r}") from None
    if not isinstance(value, datetime):
        raise InputError(f"{what} must be a datetime or ISO 8601 text")
    if value.tzinfo is not None:
        try:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        except OverflowError:
            raise InputError(f"{what} is out of range: {value.isoformat()}") from None
    return value


def not_in_future(value: datetime, now: datetime, settings: Settings, what: str = "msg_timestamp") -> datetime:
    """`value` (naive UTC) unless it lies beyond OPENHUB_MAX_CLOCK_SKEW after `now`.

    A message's timestamp decides which version of an entity is newest; one dated far ahead would
    make every genuine later update of that entity obsolete, so it is refused at the door.
    """
    skew = settings.max_clock_skew
    if value - now > skew:
        raise InputError(
            f"{what} {value.isoformat()}Z is more than OPENHUB_MAX_CLOCK_SKEW={skew.total_seconds():g} s in the future"
        )
    return value


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply lists and dicts nest in `value` (a scalar is 0), counting no further than `limit` + 1.

    Iterative, so that a payload too deep for Python's recursion limit is measured, not crashed on.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def shallow(payload: Any, settings: Settings, what: str = "payload") -> Any:
    """`payload`, unless lists and dicts nest in it deeper than OPENHUB_MAX_NESTING (InputError)."""
    # Every reader (JSON encoders, pydantic, the admin page's renderer) recurses: a payload
    # nested deeper than they go would be stored fine and then break every read that includes it.
    limit = settings.max_nesting
    if nesting_depth(payload, limit) > limit:
        raise InputError(f"{what} is nested deeper than OPENHUB_MAX_NESTING={limit} levels")
    return payload


def _validated(route: Route, payload: Any) -> Any:
    validate = route.validate
    if validate is None:
        return payload
    try:
        if isinstance(validate, type) and hasattr(validate, "model_validate"):
            validate.model_validate(payload)
        elif validate(payload) is False:
            raise InputError(f"payload refused by the validation of route {route.name}")
    except InputError:
        raise
    except pydantic.ValidationError as exc:  # each field and why, not pydantic's multi-line report
        raise InputError(f"payload refused by the validation of route {route.name}: {field_errors(exc)}") from exc
    except Exception as exc:  # the user's validator speaks in its own exceptions
        raise InputError(f"payload refused by the validation of route {route.name}: {exc}") from exc
    return payload


def field_errors(exc: pydantic.ValidationError) -> str:
    """`field: reason; other.field: reason` for each error of a pydantic validation."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in exc.errors())


def _derived(route: Route, payload: Any, what: str) -> str | None:
    fn = getattr(route, what)
    if fn is None:
        return None
    try:
        value = fn(payload)
    except Exception as exc:
        raise InputError(f"route {route.name}: cannot compute {what} from the payload: {exc!r}") from exc
    return identifier(value, what, required=False)


def prepare(
    route_name: str,
    payload: Any,
    *,
    source_system: Any,
    correlation_id: Any,
    process_id: Any = None,
    msg_timestamp: datetime | str | None = None,
    parent_id: int | None = None,
    object_id: Any = None,
    funnel: Any = None,
    entity_type: str | None = None,
    expires_at: datetime | str | None = None,
    now: datetime | None = None,
    traceparent: str | None = None,
    priority: Any = None,
    hub: Hub | None = None,
) -> dict[str, Any]:
    """Check one message and turn it into the columns of a NEW row; InputError names what is wrong.

    `priority`: 0-9, higher = sooner (None: the route's, else OPENHUB_DEFAULT_PRIORITY).

    `traceparent`: the W3C trace context the message continues (a malformed one is ignored, as W3C asks).
    `hub`: the hub whose routes and settings check it (default: the process's).
    """
    hub = given(hub)
    settings = hub.settings
    route = hub.registry.route(route_name)
    source_system = identifier(source_system, "source_system", 100)
    if route.sources and parent_id is None and source_system not in route.sources:
        raise SourceNotAllowed(
            f"{source_system} may not submit {route.name}: it takes messages from {', '.join(route.sources)} only"
        )
    correlation_id = identifier(correlation_id, "correlation_id", MAX_ID_LENGTH if parent_id is None else MAX_CHILD_ID)
    shallow(payload, settings)
    try:
        text = dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InputError(f"payload is not JSON-serialisable: {exc}") from None
    if any(isinstance(v, float) and not math.isfinite(v) for v in _floats(payload)):
        raise InputError("payload is not JSON-serialisable: NaN and infinity have no JSON form")
    try:
        encoded = text.encode()
    except UnicodeEncodeError as exc:
        raise InputError(f"payload is not valid Unicode text: {exc.reason} at position {exc.start}") from None
    limit = settings.max_payload_bytes
    size = len(encoded)
    if size > limit:
        raise PayloadTooLarge(f"payload is {size} bytes, more than OPENHUB_MAX_PAYLOAD_BYTES={limit}")
    _validated(route, payload)
    now = now or hub.clock()
    return dict(
        source_system=source_system,
        correlation_id=correlation_id,
        process_id=identifier(process_id, "process_id", required=False),
        service=route.service,
        operation=route.operation,
        object_id=identifier(object_id, "object_id", required=False) or _derived(route, payload, "object_id"),
        entity_type=identifier(entity_type, "entity_type", 100, required=False) or route.entity_type or route.operation,
        funnel=_funnel(
            identifier(funnel, "funnel", required=False) or _derived(route, payload, "funnel"), source_system
        ),
        parent_id=parent_id,
        payload=text,
        state=State.NEW.value,
        failed_count=0,
        attempts=0,
        generation=0,
        attempt_id=str(uuid.uuid4()),
        due_at=handover_due(now, settings),
        received_at=now,
        msg_timestamp=_timestamp(msg_timestamp, now, parent_id, settings),
        updated_at=now,
        expires_at=_expiry(route, expires_at, now, parent_id),
        traceparent=tracing.valid(traceparent) if isinstance(traceparent, str) else None,
        priority=message_priority(route, priority, settings),
    )


def message_priority(route: Route, value: Any, settings: Settings) -> int:
    """The priority a message is stored with: `value` (0-9, higher = sooner; a string of a digit as a
    header gives it), else the route's, else OPENHUB_DEFAULT_PRIORITY; InputError for anything else."""
    if value is None or value == "":
        return route.priority if route.priority is not None else settings.default_priority
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9:
        raise InputError(f"priority must be a whole number 0..9 (higher = sooner), got {value!r}")
    return value


def _expiry(route: Route, value: datetime | str | None, now: datetime, parent_id: int | None) -> datetime | None:
    """When the message expires: the earlier of its own expiry and its route's `expires_after`."""
    stamp = to_utc(value, "expires_at")
    if stamp is not None and stamp <= now and parent_id is None:  # a child inherits its parent's
        raise InputError(f"expires_at {stamp.isoformat()}Z has already passed")
    if route.expires_after is not None:
        stamp = min(stamp or now + route.expires_after, now + route.expires_after)
    return stamp


def _funnel(value: str | None, source_system: str | None) -> str | None:
    # A funnel is one source system's queue: a message of another system, back-dated or failing,
    # cannot hold it up (guaranteed order compares the timestamps of one system's clock only).
    if value is None:
        return None
    value = f"{source_system}:{value}"
    if len(value) > MAX_ID_LENGTH:
        raise InputError(f"funnel (with its source system) is longer than {MAX_ID_LENGTH} characters")
    return value


def _timestamp(
    value: datetime | str | None, now: datetime, parent_id: int | None, settings: Settings
) -> datetime | None:
    # None: the source gave none, and the store stamps the message (`_insert`).
    stamp = to_utc(value)
    if stamp is None:
        return None
    # A split child inherits its parent's timestamp, checked when the parent was accepted.
    return stamp if parent_id is not None else not_in_future(stamp, now, settings)


def _floats(value: Any) -> Iterable[Any]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floats(v)


def insert_new(conn: Connection, row: dict[str, Any]) -> int | None:
    """Insert a NEW message; None when (source system, correlation id) is already stored."""
    return insert_new_many(conn, [row])[0]


INSERT_CHUNK = 1000  # SQLite: rows per INSERT, far below its parameter limit
_KEY, _CHILD_KEY = (M.source_system, M.correlation_id), (M.parent_id, M.correlation_id)
# The partial unique index of each id namespace is named by its WHERE clause.
_INSERT_NEW = {
    (pg, children): insert_or_ignore(
        messages,
        pg,
        index_elements=[c.name for c in (_CHILD_KEY if children else _KEY)],
        index_where=M.parent_id.is_not(None) if children else M.parent_id.is_(None),
    )
    for pg in (False, True)
    for children in (False, True)
}


def insert_new_many(conn: Connection, rows: list[dict[str, Any]]) -> list[int | None]:
    """Insert NEW messages with their accepted entries (in the caller's transaction): each row's id, or
    None where it is already stored."""
    return _insert(conn, rows, drain=False)[0]


def _insert(conn: Connection, rows: list[dict[str, Any]], drain: bool) -> tuple[list[int | None], str | None]:
    """`insert_new_many`, and (with `drain`) the reason the hub drains (None: it does not)."""
    if not rows:
        return [], drain_reason(conn) if drain else None
    # Top-level ids are unique per source system; a split's children are unique per parent (one call
    # inserts one kind).
    children = rows[0]["parent_id"] is not None
    if not is_postgres(conn):
        reason = drain_reason(conn) if drain else None
        for row in rows:  # one host, one clock: the time it was received
            row["msg_timestamp"] = row["msg_timestamp"] or row["received_at"]
        return ([], reason) if reason is not None else (_insert_sqlite(conn, rows, children), None)
    columns = tuple(rows[0])
    found = conn.execute(_insert_arrays(columns, children, drain), {c: [row[c] for row in rows] for c in columns}).all()
    ids = _ids(rows, {(r[1], r[2]): r.id for r in found}, children)
    stamps = {r.id: r.msg_timestamp for r in found}
    for row, message_id in zip(rows, ids):  # what the store stamped, for the caller's view
        if message_id is not None:
            row["msg_timestamp"] = stamps[message_id]
    if not drain:
        return ids, None
    # Every row a duplicate: no row came back to carry the reason.
    return ids, found[0].draining if found else drain_reason(conn)


@cache
def _insert_arrays(columns: tuple[str, ...], children: bool, drain: bool) -> Any:
    # PostgreSQL: every row in one statement whose parameters are one array per column (unnest), with the
    # accepted entries as a data-modifying CTE and, with `drain`, the drain's reason. Its text is the same
    # whatever the batch size, so psycopg parses it once; a multi-row VALUES page of 100 messages had
    # 2,000 placeholders for psycopg to find on every call (13 ms a batch).
    #
    # A message the source gave no timestamp is stamped with the database's clock, not the ingress
    # host's: guaranteed order and obsolete checks compare the timestamps of messages taken in on
    # several API hosts, and one whose clock was 90 s behind sorted a later message before earlier
    # ones (issue 22). A message accepted after another's answer was sent starts its transaction after
    # that one committed, so its stamp is not earlier (and its id, the tie-break, is greater).
    key = _CHILD_KEY if children else _KEY
    arrays = (
        func.unnest(*(bindparam(c, type_=ARRAY(_unbounded(messages.c[c].type))) for c in columns))
        .table_valued(*columns)
        .render_derived()
    )
    values = [func.coalesce(c, database_now()).label(c.name) if c.name == "msg_timestamp" else c for c in arrays.c]
    new = (
        _INSERT_NEW[(True, children)]
        .from_select(list(columns), select(*values))
        .returning(M.id, *key, M.received_at, M.msg_timestamp)
        .cte("new")
    )
    accepted = insert(transitions).from_select(
        ["message_id", "at", "event", "to_state"],
        select(new.c.id, new.c.received_at, literal(Note.ACCEPTED.value), literal(State.NEW.value)),
    )
    found = [new.c.id, *(new.c[c.name] for c in key), new.c.msg_timestamp]
    if drain:
        found.append(draining().label("draining"))
    return select(*found).add_cte(accepted.cte("accepted"))


def _ids(rows: list[dict[str, Any]], stored: dict[tuple[Any, str], int], children: bool) -> list[int | None]:
    """Each row's id among the `stored` keys, or None: a key twice in one batch, the second is a duplicate."""
    key = (_CHILD_KEY if children else _KEY)[0].name
    return [stored.pop((row[key], row["correlation_id"]), None) for row in rows]


def _unbounded(type_: Any) -> Any:
    # An array parameter is cast to its element type; a cast to VARCHAR(n) would cut a longer value
    # short where inserting it into the column refuses it: cast text, and let the column check.
    return Text() if isinstance(type_, String) else type_


def _insert_sqlite(conn: Connection, rows: list[dict[str, Any]], children: bool) -> list[int | None]:
    key = _CHILD_KEY if children else _KEY
    stmt = _INSERT_NEW[(False, children)].returning(M.id, *key)
    stored: dict[tuple[Any, str], int] = {}
    for start in range(0, len(rows), INSERT_CHUNK):
        stored.update({(a, b): i for i, a, b in conn.execute(stmt, rows[start : start + INSERT_CHUNK])})
    ids = _ids(rows, stored, children)
    history = [
        dict(
            message_id=i,
            at=row["received_at"],
            event=Note.ACCEPTED.value,
            from_state=None,
            to_state=State.NEW.value,
            step_key=None,
            detail=None,
        )
        for i, row in zip(ids, rows)
        if i
    ]
    for start in range(0, len(history), INSERT_CHUNK):
        conn.execute(insert(transitions), history[start : start + INSERT_CHUNK])
    return ids


def insert_unless_draining(conn: Connection, rows: list[dict[str, Any]]) -> list[int | None]:
    """`insert_new_many`, or Draining (nothing stored) while the hub drains.

    On PostgreSQL it is one round trip, the rows, their history entries and the drain check in one
    statement, rolled back by the Draining it raises.
    """
    ids, reason = _insert(conn, rows, drain=True)
    if reason is not None:
        raise Draining(f"the hub is draining ({reason}): no new messages are taken; retry later")
    return ids


def publish_new(hub: Hub, fresh: list[tuple[int, dict[str, Any]]]) -> set[int]:
    """Publish the chains of freshly committed NEW messages; the ids whose chain the broker took.

    Nothing is written back: the message stays NEW until its first task claims it, and one whose
    chain was refused (or lost) is re-driven by the poller when its due time comes.
    """
    return hub.publisher.publish_many(
        [
            (
                hub.registry.route(route_name(row["service"], row["operation"])),
                message_id,
                row["attempt_id"],
                0,
                row.get("traceparent"),
                row.get("priority"),
            )
            for message_id, row in fresh
        ]
    )
