"""The operators' tables: holds of workers and hosts, operator tokens, the audit trail, live settings and
each process kind's snapshot of its settings. Apart from the messages' tables (schema.py, which exports
every table of the store); the same declarative base, so one metadata and one migration history.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from openhub.store.columns import Base, Id, Redacted


class WorkerHold(Base):
    """An operator's "finish what you have, take nothing new" for one worker or every worker of a host."""

    __tablename__ = "worker_holds"

    target: Mapped[str] = mapped_column(String(300), primary_key=True)  # worker:<id> or host:<hostname>
    since: Mapped[datetime] = mapped_column(DateTime)
    reason: Mapped[str | None] = mapped_column(Redacted)
    by: Mapped[str | None] = mapped_column(String(100))


class OperatorToken(Base):
    """A named operator token (`openhub tokens add`): its role, kept by the SHA-256 of the secret only."""

    __tablename__ = "operator_tokens"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    role: Mapped[str] = mapped_column(String(20))  # viewer, operator, admin (openhub.roles)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # hex SHA-256 of the secret
    created_at: Mapped[datetime] = mapped_column(DateTime)
    created_by: Mapped[str | None] = mapped_column(String(100))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)  # revoked: refused, kept for the audit


class AuditEntry(Base):
    """One operator action (openhub.store.audit), written in the transaction of its effect; never updated."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime)
    who: Mapped[str] = mapped_column(String(100))  # the token's name ("admin": OPENHUB_ADMIN_TOKEN; "cli")
    role: Mapped[str] = mapped_column(String(20))
    action: Mapped[str] = mapped_column(String(50))
    target: Mapped[str | None] = mapped_column(Redacted)  # the setting, route, system or token acted on
    message_ids: Mapped[str | None] = mapped_column(Text)  # JSON list of the messages acted on
    old_value: Mapped[str | None] = mapped_column(Redacted)
    new_value: Mapped[str | None] = mapped_column(Redacted)
    client: Mapped[str | None] = mapped_column(String(100))  # the client's address
    request_id: Mapped[str | None] = mapped_column(String(100))

    __table_args__ = (
        Index("ix_audit_at", "at"),
        Index("ix_audit_who", "who", "at"),
        Index("ix_audit_action", "action", "at"),
    )


class LiveSetting(Base):
    """A setting an admin changed at run time (openhub.store.live): every process applies it within one poll
    interval, on top of its environment's."""

    __tablename__ = "live_settings"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)  # the environment variable's name
    value: Mapped[str] = mapped_column(Text)  # as the environment variable would spell it
    set_at: Mapped[datetime] = mapped_column(DateTime)
    set_by: Mapped[str | None] = mapped_column(String(100))
    reason: Mapped[str | None] = mapped_column(Redacted)


class SettingsSnapshot(Base):
    """The settings in force in the newest process of a kind (api, worker, beat) that loaded or changed them."""

    __tablename__ = "settings_snapshots"

    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    node: Mapped[str] = mapped_column(String(255))  # host:pid of the process
    settings: Mapped[str] = mapped_column(Text)  # JSON list of {name, value (secrets masked), source, live}
    seen_at: Mapped[datetime] = mapped_column(DateTime)


class AuditMessage(Base):
    """Which messages an audit entry acted on: the message's history shows its entries through this."""

    __tablename__ = "audit_messages"

    audit_id: Mapped[int] = mapped_column(Id, ForeignKey("audit.id"), primary_key=True)
    message_id: Mapped[int] = mapped_column(Id, primary_key=True)  # no foreign key: the archive moves messages

    __table_args__ = (Index("ix_audit_messages_message", "message_id"),)
