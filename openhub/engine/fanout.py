"""A topic's message accepted: its receivers, one NEW message per subscribed route, written in the accept's
transaction (openhub.core.topics has the model).

`prepare_receivers` checks every receiver before anything is written (a subscriber's `validate` refusing the
payload refuses the accept, nothing stored: all or nothing, as `submit_many` is); `write_receivers` inserts
them under their family once the family's row has its id, and ends the family OK (`Event.FANNED_OUT`). Their
chains are published after commit with the other new messages'; the family has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, select

from openhub.core.errors import InputError
from openhub.core.model import route_name
from openhub.core.states import Event, State
from openhub.core.topics import is_topic, subscribers
from openhub.engine.hub import Hub
from openhub.engine.intake import insert_new_many, message_priority, prepare
from openhub.engine.lifecycle import FollowUps, Tx, apply_event
from openhub.store.queries import M, loads

_PENDING = 0  # a receiver's parent_id until its family's row has its id (prepare checks it as a child's)


@dataclass
class Family:
    """A topic's message among the rows being stored (`at`) and its prepared receivers."""

    at: int
    receivers: list[dict[str, Any]]


def receiver_correlation_id(family_correlation_id: str, n: int) -> str:
    """The correlation id of a family's `n`-th receiver (1-based), in the namespace of its family (as a
    split child's: `<id>#0.<n>`)."""
    return f"{family_correlation_id}#0.{n}"


def prepare_receivers(rows: list[dict[str, Any]], hub: Hub) -> list[Family]:
    """The receivers of each topic's message among the prepared NEW `rows`; InputError (naming the receiving
    route) where one refuses the message.

    A receiver inherits its family's source system, ids, timestamp and expiry, and runs at its route's
    priority or the family's, whichever is higher; its entity, funnel and validation are its route's."""
    registry = hub.registry
    families = []
    for at, row in enumerate(rows):
        topic = registry.route(route_name(row["service"], row["operation"]))
        if not is_topic(topic):
            continue
        payload = loads(row["payload"])
        receivers = []
        for n, route in enumerate(subscribers(registry.routes, topic.name), 1):
            try:
                receivers.append(
                    prepare(
                        route.name,
                        payload,
                        source_system=row["source_system"],
                        correlation_id=receiver_correlation_id(row["correlation_id"], n),
                        process_id=row["process_id"],
                        msg_timestamp=row["msg_timestamp"],
                        parent_id=_PENDING,
                        expires_at=row["expires_at"],
                        now=row["received_at"],
                        traceparent=row["traceparent"],
                        priority=max(row["priority"], message_priority(route, None, hub.settings)),
                        hub=hub,
                    )
                )
            except InputError as exc:
                raise type(exc)(f"receiver {route.name} of topic {topic.name}: {exc}") from None
        families.append(Family(at, receivers))
    return families


def write_receivers(
    conn: Connection, rows: list[dict[str, Any]], ids: list[int | None], families: list[Family], hub: Hub
) -> list[tuple[int, dict[str, Any]]]:
    """Insert the receivers of the families just inserted (a duplicate's were written with its first) and
    end each family OK; the receivers' (id, row), whose chains are to be published after commit.

    The family's row in `rows` is updated to what was written (OK, finished), for the caller's view."""
    written = [f for f in families if ids[f.at] is not None]
    receivers: list[dict[str, Any]] = []
    for family in written:
        row = rows[family.at]
        for receiver in family.receivers:
            # Stamped as its family was (by the store's clock, where the source gave no timestamp), and due
            # when it is: at once in a caller's transaction, whose commit nothing may report.
            receiver.update(parent_id=ids[family.at], msg_timestamp=row["msg_timestamp"], due_at=row["due_at"])
        receivers.extend(family.receivers)
    receiver_ids = insert_new_many(conn, receivers) if receivers else []
    for family in written:
        row = rows[family.at]
        names = ", ".join(route_name(r["service"], r["operation"]) for r in family.receivers) or "none subscribed"
        tx = Tx(conn, row["received_at"], FollowUps(), hub)  # asks for nothing after commit
        topic = hub.registry.route(route_name(row["service"], row["operation"]))
        apply_event(
            tx,
            SimpleNamespace(**row, id=ids[family.at]),
            Event.FANNED_OUT,
            topic,
            detail=f"{len(family.receivers)} receiver(s): {names}",
        )
        row.update(state=State.OK.value, due_at=None, finished_at=tx.now)
    return [(i, r) for i, r in zip(receiver_ids, receivers) if i is not None]


def receivers_of(conn: Connection, family_id: int) -> list[dict[str, Any]]:
    """A family's receivers, in the order they were written: `{id, route, correlation_id, state}` each."""
    rows = conn.execute(
        select(M.id, M.service, M.operation, M.correlation_id, M.state).where(M.parent_id == family_id).order_by(M.id)
    )
    return [
        {"id": r.id, "route": route_name(r.service, r.operation), "correlation_id": r.correlation_id, "state": r.state}
        for r in rows
    ]
