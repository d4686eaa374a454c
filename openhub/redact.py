"""Secrets kept out of what the hub stores, logs and sends on: one place that redacts them.

The hub's outbound credentials (a URL's `user:password@`, an `?api_key=` or `?token=`, headers such
as `Authorization` or `Ocp-Apim-Subscription-Key`) must never reach a recorded exchange, an error
text (a message's `failed_error`, an external call's or a confirmation's `last_error`), a log line,
or what confirmers, webhooks and source systems are told. Every text the hub keeps about an
external call passes through `redact_text`; every recorded URL through `redact_url`; headers through
`redact_headers`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"
IN_URL = "***"  # what stands for a secret in a URL (brackets would make it an IPv6 host)
# Names of query parameters and headers that carry a credential.
SECRET_NAME = re.compile(r"token|secret|passw(or)?d|passwd|api[-_]?key|apikey|session|signature|^sig$|^key$"
                         r"|subscription|credential|auth|cookie|^code$", re.IGNORECASE)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """`url` without its userinfo (`user:password@`) and with secret-named query values redacted (`***`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return IN_URL
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{IN_URL}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(SECRET_NAME.search(name) for name, _ in pairs):
            query = urlencode([(n, IN_URL if SECRET_NAME.search(n) else v) for n, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str | None) -> str | None:
    """`text` (an error, a traceback) with every URL in it redacted as `redact_url` does."""
    if not text or "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group()), text)


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers with the values of credential-bearing ones (by name) replaced by `[redacted]`."""
    return {name: REDACTED if SECRET_NAME.search(name) else value for name, value in headers}
