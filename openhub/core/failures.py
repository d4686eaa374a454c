"""What a step's exception means: fatal or worth retrying, and the error code it is searched by.

Seed 003: validation errors fail a message at once; faults of the moment (timeouts, refused
connections, 5xx) are retried. Besides `Reject`, these are fatal: the exception classes a route
or step names in `fatal=`, a pydantic ValidationError, and an HTTP 4xx answer raised by httpx's
`raise_for_status()` other than 408, 425 and 429, which ask to try again.
"""

from __future__ import annotations

import httpx
import pydantic

from openhub.core import codes
from openhub.core.errors import Reject

RETRYABLE_4XX = codes.RETRYABLE_4XX


def is_fatal(exc: BaseException, fatal: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether `exc` fails the message at once instead of being retried."""
    if isinstance(exc, Reject) or (fatal and isinstance(exc, fatal)):
        return True
    if isinstance(exc, pydantic.ValidationError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return 400 <= status < 500 and status not in RETRYABLE_4XX
    return False


def error_code(exc: BaseException) -> str:
    """A short, searchable code for a failure: the exception's own `code`, else what it is."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code[:100]
    if isinstance(exc, Reject):
        return codes.REJECTED
    if isinstance(exc, httpx.HTTPStatusError):
        return codes.http(exc.response.status_code)
    if isinstance(exc, pydantic.ValidationError):
        return codes.VALIDATION
    if isinstance(exc, (httpx.LocalProtocolError, httpx.UnsupportedProtocol)):
        return codes.INVALID_REQUEST  # refused by httpx before sending (a newline in a header): not the system's fault
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return codes.TIMEOUT
    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return codes.CONNECTION
    return type(exc).__name__[:100]
