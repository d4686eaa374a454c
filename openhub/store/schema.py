"""SQLAlchemy 2.0 models of the message store: the messages' tables here, the operators' in
operator_tables.py; this module exports every table of the store (the code, tests and migrations read them
from here).

Text the hub writes about messages (errors, history details, recorded exchanges, business errors) is of
the column types `Redacted` and `RedactedJson` (columns.py): stored with secrets redacted whoever writes it.

Indexes are chosen so the poller's queries touch only live rows: `ix_messages_due` is a partial
index over rows with a due time, which every final state clears, so its cost does not grow
with the number of OK/FAILED messages kept in the table. Timestamps are naive UTC.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import cast

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from openhub.store.columns import Base, Id, Redacted, RedactedJson
from openhub.store.operator_tables import (
    AuditEntry,
    AuditMessage,
    LiveSetting,
    OperatorToken,
    SettingsSnapshot,
    WorkerHold,
)

__all__ = [
    "LIVE_PREDICATE",
    "AuditEntry",
    "AuditMessage",
    "Base",
    "Breaker",
    "Confirmation",
    "ExtCall",
    "HttpExchange",
    "Id",
    "LiveSetting",
    "Message",
    "OperatorToken",
    "Redacted",
    "RedactedJson",
    "RoutePause",
    "SettingsSnapshot",
    "SystemRate",
    "SystemSlot",
    "Transition",
    "Wait",
    "Worker",
    "WorkerHold",
    "audit",
    "audit_messages",
    "breakers",
    "confirmations",
    "ext_calls",
    "http_exchanges",
    "live_settings",
    "messages",
    "operator_tokens",
    "route_pauses",
    "settings_snapshots",
    "system_rates",
    "system_slots",
    "transitions",
    "waits",
    "worker_holds",
    "workers",
]

# Rows not in a final state (states.FINAL, spelled out: this module imports no domain code).
LIVE_PREDICATE = "state NOT IN ('CANCEL', 'FAILED', 'OK', 'SKIPPED')"


class Message(Base):
    """One asynchronous message: its payload, where it stands in its route and why."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    source_system: Mapped[str] = mapped_column(String(100))
    # Submitted ids are up to 255 characters; a split child's is its parent's plus "#generation.n".
    correlation_id: Mapped[str] = mapped_column(String(320))
    process_id: Mapped[str | None] = mapped_column(String(255))
    service: Mapped[str] = mapped_column(String(100))
    operation: Mapped[str] = mapped_column(String(100))
    object_id: Mapped[str | None] = mapped_column(String(255))
    entity_type: Mapped[str | None] = mapped_column(String(100))
    funnel: Mapped[str | None] = mapped_column(String(255))
    parent_id: Mapped[int | None] = mapped_column(Id, ForeignKey("messages.id"))
    payload: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20))
    failed_count: Mapped[int] = mapped_column(Integer, default=0)
    # Fencing token of the chain that may carry the message; a new one per dispatch.
    attempt_id: Mapped[str | None] = mapped_column(String(36))
    # The step run currently executing (at most one per message), guarded by `due_at` as its lease.
    step_run: Mapped[str | None] = mapped_column(String(36))
    # The worker process running `step_run` (workers.id): its heartbeat tells a slow step from a dead one.
    # Kept after a cancel until the run ends, so no second run of the step starts while the first is in flight.
    worker: Mapped[str | None] = mapped_column(String(36))
    # Since when the message waits behind another message of its funnel (the order timeout counts from here).
    blocked_since: Mapped[datetime | None] = mapped_column(DateTime)
    # When the poller must look at the message: next attempt, lease expiry or response timeout.
    due_at: Mapped[datetime | None] = mapped_column(DateTime)
    received_at: Mapped[datetime] = mapped_column(DateTime)
    msg_timestamp: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    custom_data: Mapped[str | None] = mapped_column(Text)
    business_errors: Mapped[str | None] = mapped_column(RedactedJson)
    response: Mapped[str | None] = mapped_column(Text)
    # A synchronous route's result (Route(sync=True)): its last step's return value as JSON, written with OK.
    result: Mapped[str | None] = mapped_column(Text)
    failed_step: Mapped[str | None] = mapped_column(String(100))
    failed_error: Mapped[str | None] = mapped_column(Redacted)
    error_code: Mapped[str | None] = mapped_column(String(100))  # of the last failure (openhub.core.failures)
    # Past this, the message is no longer started (a retry, a postponed or queued message): FAILED, EXPIRED.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    # The message's W3C trace context (openhub.core.tracing): every span of its life continues this trace.
    traceparent: Mapped[str | None] = mapped_column(String(55))
    # 0-9, higher = sooner: the broker's task priority and the poller's order among due messages.
    priority: Mapped[int] = mapped_column(SmallInteger, default=4, server_default="4")

    __table_args__ = (
        # A source system's own ids, and its split children's ids per parent: two namespaces, so an id a
        # source system sends can never be taken for a child's (nor a child's for a genuine new message).
        Index(
            "uq_messages_source_correlation",
            "source_system",
            "correlation_id",
            unique=True,
            postgresql_where=text("parent_id IS NULL"),
            sqlite_where=text("parent_id IS NULL"),
        ),
        Index(
            "uq_messages_child",
            "parent_id",
            "correlation_id",
            unique=True,
            postgresql_where=text("parent_id IS NOT NULL"),
            sqlite_where=text("parent_id IS NOT NULL"),
        ),
        # Final states clear due_at, so this index holds only the poller's live rows.
        Index(
            "ix_messages_due",
            "due_at",
            postgresql_where=text("due_at IS NOT NULL"),
            sqlite_where=text("due_at IS NOT NULL"),
        ),
        Index(
            "ix_messages_funnel",
            "funnel",
            "state",
            "msg_timestamp",
            postgresql_where=text("funnel IS NOT NULL"),
            sqlite_where=text("funnel IS NOT NULL"),
        ),
        Index("ix_messages_state_received", "state", "received_at"),
        Index("ix_messages_route", "service", "operation", "received_at"),
        Index("ix_messages_entity", "entity_type", "object_id"),
        Index("ix_messages_parent", "parent_id"),
        Index("ix_messages_received", "received_at"),
        Index(
            "ix_messages_error_code",
            "error_code",
            "received_at",
            postgresql_where=text("error_code IS NOT NULL"),
            sqlite_where=text("error_code IS NOT NULL"),
        ),
        # Only rows with a step in flight: the poller finds a dead worker's messages through it.
        Index(
            "ix_messages_worker",
            "worker",
            postgresql_where=text("worker IS NOT NULL"),
            sqlite_where=text("worker IS NOT NULL"),
        ),
        # The overview counts messages finished per minute and per route over the last day; without
        # this index that is a scan of every message ever kept. On PostgreSQL it carries the columns
        # those counts group by, so they are index-only scans (migration 0006).
        # The live rows only (final states leave it), by route: the overview's per-route counts and
        # oldest message are an index-only scan of this, whatever the table holds (migration 0006).
        # The predicate must read exactly as overview.route_states writes it, so the planner matches them.
        Index(
            "ix_messages_live",
            "state",
            "service",
            "operation",
            "received_at",
            postgresql_where=text(LIVE_PREDICATE),
            sqlite_where=text(LIVE_PREDICATE),
        ),
        Index(
            "ix_messages_finished",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
            sqlite_where=text("finished_at IS NOT NULL"),
            postgresql_include=["state", "service", "operation"],
        ),
    )


class ExtCall(Base):
    """The record of one guarded call to an external system, unique by its idempotency key."""

    __tablename__ = "ext_calls"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(600), unique=True)
    message_id: Mapped[int] = mapped_column(Id, ForeignKey("messages.id"))
    step_key: Mapped[str] = mapped_column(String(100))
    scope: Mapped[str] = mapped_column(String(10))
    state: Mapped[str] = mapped_column(String(10))  # PROCESSING, OK, FAILED
    msg_timestamp: Mapped[datetime] = mapped_column(DateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Redacted)
    worker: Mapped[str | None] = mapped_column(String(255))  # host:pid of the process of the last attempt
    # The last message whose call succeeded, kept when another message takes the record over (entity and
    # custom scopes): that message must never call again, whatever the newer message's call did.
    # Not a foreign key: the archive may move that message away while the record stays.
    ok_message_id: Mapped[int | None] = mapped_column(Id)
    ok_msg_timestamp: Mapped[datetime | None] = mapped_column(DateTime)

    __table_args__ = (
        Index("ix_ext_calls_message", "message_id"),
        Index("ix_ext_calls_updated", "updated_at"),  # metrics read the calls finished since the last scrape
    )


class Transition(Base):
    """One change of a message's state, kept as its history."""

    __tablename__ = "transitions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(Id, ForeignKey("messages.id"))
    at: Mapped[datetime] = mapped_column(DateTime)
    event: Mapped[str] = mapped_column(String(30))
    from_state: Mapped[str | None] = mapped_column(String(20))
    to_state: Mapped[str] = mapped_column(String(20))
    step_key: Mapped[str | None] = mapped_column(String(100))
    detail: Mapped[str | None] = mapped_column(Redacted)

    __table_args__ = (Index("ix_transitions_message", "message_id"),)


class Wait(Base):
    """One ask of a step that waits for a response (`ctx.wait_for_response`), and the answer bound to it.

    Its token is the asking step run's id (`ctx.wait_token`): the responder sends it back with the answer,
    which is taken for this ask and no other. A row is written when the step records its wait, or
    earlier when an answer comes while the step still runs; answers that came again are not kept.
    """

    __tablename__ = "waits"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)  # the order of the asks
    token: Mapped[str] = mapped_column(String(36), unique=True)
    message_id: Mapped[int] = mapped_column(Id, ForeignKey("messages.id"))
    step_key: Mapped[str | None] = mapped_column(String(100))  # None until the step records its wait
    asked_at: Mapped[datetime | None] = mapped_column(DateTime)  # the wait recorded; None: answered first
    answer: Mapped[str | None] = mapped_column(Text)  # JSON text
    answered_at: Mapped[datetime | None] = mapped_column(DateTime)
    answered_by: Mapped[str | None] = mapped_column(String(100))

    __table_args__ = (Index("ix_waits_message", "message_id"),)


class Confirmation(Base):
    """The confirmation of a final message to its source system, retried until it succeeds."""

    __tablename__ = "confirmations"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(Id, ForeignKey("messages.id"))
    outcome: Mapped[str] = mapped_column(String(20))  # the message state being confirmed
    state: Mapped[str] = mapped_column(String(20))  # PENDING, SENDING, OK, FAILED, FAILED_END
    claim: Mapped[str | None] = mapped_column(String(36))  # the sender that took it (compare-and-set)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    due_at: Mapped[datetime | None] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    last_error: Mapped[str | None] = mapped_column(Redacted)
    # None: the confirmation to the source system; else the state hook (@on_state) to call.
    hook: Mapped[str | None] = mapped_column(String(300))
    # Random, the same on every retry: the notification's id for its receiver (the webhook-id), which no
    # one can guess ahead of it to take its place in the receiver's dedupe (None: written before 0015).
    delivery_key: Mapped[str | None] = mapped_column(String(40), default=lambda: secrets.token_urlsafe(18))

    __table_args__ = (
        Index("ix_confirmations_message", "message_id"),
        Index("ix_confirmations_state", "state"),
        Index(
            "ix_confirmations_due",
            "due_at",
            postgresql_where=text("due_at IS NOT NULL"),
            sqlite_where=text("due_at IS NOT NULL"),
        ),
    )


class Worker(Base):
    """One worker process that runs steps, alive while its heartbeat is fresh (see openhub.store.workers)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # one per process start
    node: Mapped[str] = mapped_column(String(255))  # host and pid, for operators
    up_since: Mapped[datetime] = mapped_column(DateTime)  # start of its unbroken run of heartbeats
    last_seen: Mapped[datetime] = mapped_column(DateTime)
    runs: Mapped[str | None] = mapped_column(Text)  # the step runs in flight at last_seen, comma-separated
    parent: Mapped[str | None] = mapped_column(String(255))  # host:pid of the process that started it
    # A worker's main process (it takes the broker's tasks): whether it took them at last_seen, or was
    # held by an operator (worker_holds); None: a process that takes nothing from the broker (a pool's).
    taking: Mapped[bool | None] = mapped_column(Boolean)


class RoutePause(Base):
    """A paused route: nothing of it is processed until an operator resumes it."""

    __tablename__ = "route_pauses"

    route: Mapped[str] = mapped_column(String(201), primary_key=True)
    paused_at: Mapped[datetime] = mapped_column(DateTime)
    reason: Mapped[str | None] = mapped_column(Redacted)
    # The drain's row only: True while the drain refuses new messages and lets the stored ones go on (retries
    # included); None: nothing starts either (the drain of before, and `drain()`'s default).
    intake_only: Mapped[bool | None] = mapped_column(Boolean)


class Breaker(Base):
    """The circuit breaker of an external system (`@step(system=...)`), shared by every worker."""

    __tablename__ = "breakers"

    system: Mapped[str] = mapped_column(String(100), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)  # in a row, of any message's steps
    open_until: Mapped[datetime | None] = mapped_column(DateTime)  # no call before (then one trial)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    reason: Mapped[str | None] = mapped_column(Redacted)  # why an operator opened it (None: its failures did)


class SystemSlot(Base):
    """One of the calls a limited external system (OPENHUB_SYSTEM_LIMITS) may have in flight."""

    __tablename__ = "system_slots"

    system: Mapped[str] = mapped_column(String(100), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    step_run: Mapped[str | None] = mapped_column(String(36))  # the run holding it
    held_until: Mapped[datetime | None] = mapped_column(DateTime)  # its lease: a dead run's slot is free after


class SystemRate(Base):
    """The token bucket of a rate-limited external system (OPENHUB_SYSTEM_RATES)."""

    __tablename__ = "system_rates"

    system: Mapped[str] = mapped_column(String(100), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)  # calls that may start now
    updated_at: Mapped[datetime] = mapped_column(DateTime)  # when `tokens` was right


class HttpExchange(Base):
    """One recorded HTTP request and its response, made by a step through `openhub.outbound.http` with recording on.

    Written in its own short transaction right after the exchange, so it survives a later crash of
    the step; headers are stored with secrets redacted and bodies truncated (OPENHUB_HTTP_RECORD_BYTES).
    """

    __tablename__ = "http_exchanges"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(Id, ForeignKey("messages.id"))
    step_key: Mapped[str] = mapped_column(String(100))
    attempt: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(10))
    url: Mapped[str] = mapped_column(Redacted)
    status: Mapped[int | None] = mapped_column(Integer)  # None: no response (timeout, connection error)
    error: Mapped[str | None] = mapped_column(Redacted)
    request_headers: Mapped[str | None] = mapped_column(RedactedJson)  # JSON object
    request_body: Mapped[str | None] = mapped_column(Redacted)
    response_headers: Mapped[str | None] = mapped_column(RedactedJson)  # JSON object
    response_body: Mapped[str | None] = mapped_column(Redacted)
    duration_ms: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime)

    __table_args__ = (
        Index("ix_http_exchanges_message", "message_id"),
        Index("ix_http_exchanges_at", "at"),  # retention prunes by age
    )


def _table(model: type[Base]) -> Table:
    """A model's table, typed as the Table it is (SQLAlchemy types `__table__` as any FromClause)."""
    return cast(Table, model.__table__)


messages = _table(Message)
ext_calls = _table(ExtCall)
transitions = _table(Transition)
waits = _table(Wait)
confirmations = _table(Confirmation)
route_pauses = _table(RoutePause)
breakers = _table(Breaker)
system_slots = _table(SystemSlot)
system_rates = _table(SystemRate)
workers = _table(Worker)
worker_holds = _table(WorkerHold)
http_exchanges = _table(HttpExchange)
operator_tokens = _table(OperatorToken)
audit = _table(AuditEntry)
audit_messages = _table(AuditMessage)
live_settings = _table(LiveSetting)
settings_snapshots = _table(SettingsSnapshot)
