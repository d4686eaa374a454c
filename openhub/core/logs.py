"""Log lines that say which message they are about, as text or JSON (OPENHUB_LOG_FORMAT=text|json).

While a step or a confirmation of a message runs, every log record made in that context (the hub's,
the step's own, a library's) carries `message_id`, `correlation_id` and `trace_id` (the id of the
message's trace, openhub.core.tracing; None when it has none). The text format appends them to the line
(`[message 12 c-1 trace 4bf9…]`; a correlation id with anything but letters, digits and `._:@#/-` in it is
written quoted, as logfmt does, `[message 12 "x] [message 1 y" trace 4bf9…]`, so no id can end the suffix
early and forge another); the JSON format writes one object per line with them as fields, for a log
pipeline (Loki, Elasticsearch) to join the lines to the trace.

Every record's text and traceback pass `openhub.core.redact.redact_text` first (`RedactingFilter`): no line
carries the hub's secrets. `install()` sets all of it up for a process's handlers (the Celery worker's
after its logging is set up, `openhub serve` through uvicorn's log configuration).
"""

from __future__ import annotations

import json
import logging
import re
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from openhub.core.redact import redact_text

FIELDS = ("message_id", "correlation_id", "trace_id")
about: ContextVar[tuple[int, str, str | None] | None] = ContextVar("openhub_message", default=None)


class MessageScope:
    """The block runs about one message: log records made in it carry its ids (see the module doc).
    `with` gives `yields`."""

    __slots__ = ("value", "token", "yields")

    def __init__(self, message_id: int, correlation_id: str, trace_id: str | None, yields: Any = None) -> None:
        self.value = (message_id, correlation_id, trace_id)
        self.yields = yields
        self.token: Any = None

    def __enter__(self) -> Any:
        self.token = about.set(self.value)
        return self.yields

    def __exit__(self, *_: object) -> None:
        about.reset(self.token)


class MessageFields(logging.Filter):
    """A handler's filter that gives each record made about a message its ids (it lets every record pass)."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = about.get()
        if current is not None:
            if getattr(record, "message_id", None) is None:  # a step's ctx.log names them already
                record.message_id, record.correlation_id = current[0], current[1]
            if getattr(record, "trace_id", None) is None:
                record.trace_id = current[2]
        return True


class RedactingFilter(logging.Filter):
    """A handler's filter that redacts every record's text, its traceback included (openhub.core.redact): a
    library's line (httpx logs each request's URL) or a step's own is written without the hub's secrets.
    It lets every record pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            clean = redact_text(message)
            if clean != message:
                record.msg, record.args = clean, None
            if record.exc_info and not record.exc_text:
                record.exc_text = _FORMATTER.formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact_text(record.exc_text)
            if record.stack_info:
                record.stack_info = redact_text(record.stack_info)
        except Exception:
            pass
        return True


_FORMATTER = logging.Formatter()


class TextFormatter(logging.Formatter):
    """The handler's own format, with `[message <id> <correlation id> trace <trace id>]` appended to
    lines about a message."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        message_id = getattr(record, "message_id", None)
        if message_id is None:
            return line
        trace = getattr(record, "trace_id", None)
        return f"{line} [message {message_id} {quoted(str(getattr(record, 'correlation_id', '')))}" + (
            f" trace {trace}]" if trace else "]"
        )


_BARE = re.compile(r"[\w.:@#/-]+", re.ASCII)


def quoted(value: str) -> str:
    """`value` as it may stand in a log line's suffix: bare when it holds only letters, digits and
    `._:@#/-`, else a JSON string (quotes, backslashes and unprintable characters escaped), so a
    correlation id such as `x] [message 1 y` cannot close the suffix and start a forged one."""
    if _BARE.fullmatch(value):
        return value
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in json.dumps(value, ensure_ascii=False))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the message's ids, and the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info or record.exc_text:  # as RedactingFilter left it
            out["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(out, ensure_ascii=False, default=str)


def install(handlers: list[logging.Handler] | None, log_format: str) -> None:
    """Make `handlers` (None: the root logger's) give records the ids of the message they are about and
    format them as `log_format` says: the driver's settings' OPENHUB_LOG_FORMAT, which it hands in."""
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if isinstance(handler.formatter, (TextFormatter, JsonFormatter)):
            continue
        handler.addFilter(MessageFields())
        handler.addFilter(RedactingFilter())
        handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(handler.formatter))
