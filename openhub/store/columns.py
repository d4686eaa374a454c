"""The store's declarative base and the column types its tables share (schema.py, operator_tables.py).

Text the hub writes about messages (errors, history details, recorded exchanges, business errors) is of
the column types `Redacted` and `RedactedJson`: stored with secrets redacted whoever writes it.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from openhub.core.redact import redact_json_text, redact_text

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
Id = BigInteger().with_variant(Integer(), "sqlite")


class Redacted(TypeDecorator[str]):
    """Text the hub writes about a message (an error, a history detail, a recorded body): whatever module
    writes it, it is stored with secrets redacted (`openhub.core.redact.redact_text`), so no writer can forget."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return redact_text(value) if isinstance(value, str) else value


class RedactedJson(TypeDecorator[str]):
    """JSON text (recorded headers, business errors) stored with every string in it redacted
    (`openhub.core.redact.redact_json_text`)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return redact_json_text(value) if isinstance(value, str) else value


class Base(DeclarativeBase):
    """Declarative base of the store's tables."""
