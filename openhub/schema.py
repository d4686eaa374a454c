"""SQLAlchemy 2.0 models of the message store.

Indexes are chosen so the poller's queries touch only live rows: `ix_messages_due` is a partial
index over rows with a due time, which every final state clears, so its cost does not grow
with the number of OK/FAILED messages kept in the table. Timestamps are naive UTC.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
Id = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """Declarative base of the store's tables."""


class Message(Base):
    """One asynchronous message: its payload, where it stands in its route and why."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    source_system: Mapped[str] = mapped_column(String(100))
    correlation_id: Mapped[str] = mapped_column(String(255))
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
    business_errors: Mapped[str | None] = mapped_column(Text)
    response: Mapped[str | None] = mapped_column(Text)
    failed_step: Mapped[str | None] = mapped_column(String(100))
    failed_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("source_system", "correlation_id", name="uq_messages_source_correlation"),
        # Final states clear due_at, so this index holds only the poller's live rows.
        Index("ix_messages_due", "due_at", postgresql_where=text("due_at IS NOT NULL"),
              sqlite_where=text("due_at IS NOT NULL")),
        Index("ix_messages_funnel", "funnel", "state", "msg_timestamp",
              postgresql_where=text("funnel IS NOT NULL"), sqlite_where=text("funnel IS NOT NULL")),
        Index("ix_messages_state_received", "state", "received_at"),
        Index("ix_messages_route", "service", "operation", "received_at"),
        Index("ix_messages_entity", "entity_type", "object_id"),
        Index("ix_messages_parent", "parent_id"),
        Index("ix_messages_received", "received_at"),
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
    last_error: Mapped[str | None] = mapped_column(Text)

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
    detail: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_transitions_message", "message_id"),)


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
    last_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_confirmations_message", "message_id"),
        Index("ix_confirmations_state", "state"),
        Index("ix_confirmations_due", "due_at", postgresql_where=text("due_at IS NOT NULL"),
              sqlite_where=text("due_at IS NOT NULL")),
    )


class RoutePause(Base):
    """A paused route: nothing of it is processed until an operator resumes it."""

    __tablename__ = "route_pauses"

    route: Mapped[str] = mapped_column(String(201), primary_key=True)
    paused_at: Mapped[datetime] = mapped_column(DateTime)
    reason: Mapped[str | None] = mapped_column(Text)


messages = Message.__table__
ext_calls = ExtCall.__table__
transitions = Transition.__table__
confirmations = Confirmation.__table__
route_pauses = RoutePause.__table__
