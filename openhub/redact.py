"""Secrets kept out of what the hub stores, logs and sends on: one place that redacts them.

The hub's outbound credentials (a URL's `user:password@`, an `?api_key=` or `?token=`, headers such
as `Authorization` or `Ocp-Apim-Subscription-Key`) must never reach a recorded exchange, an error
text (a message's `failed_error`, an external call's or a confirmation's `last_error`), a log line,
or what confirmers, webhooks and source systems are told. Every text the hub keeps about an
external call passes through `redact_text`; every recorded URL through `redact_url`; headers through
`redact_headers` (by name, built-in or configured, and by a value that looks like a credential
whatever its name); recorded bodies through `redact_body`.

Nothing here raises: a body the hub cannot parse is kept as it was (or, under `all`, not at all),
so redaction never turns a good call into a failed step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"
IN_URL = "***"  # what stands for a secret in a URL (brackets would make it an IPv6 host)
# Names of query parameters and headers that carry a credential.
SECRET_NAME = re.compile(r"token|secret|passw(or)?d|passwd|api[-_]?key|apikey|session|signature|^sig$|^key$"
                         r"|subscription|credential|auth|cookie|^code$", re.IGNORECASE)
# Header values that are a credential whatever the header is called: an HTTP auth scheme and its
# credentials, or a JWT (base64url of `{"...` twice, so `eyJ` then `.eyJ`) anywhere in the value.
SECRET_VALUE = re.compile(r"^\s*(?:bearer|basic|digest|negotiate)\s+\S|eyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.",
                          re.IGNORECASE)
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


def redact_headers(headers: Iterable[tuple[str, str]], names: Iterable[str] = ()) -> dict[str, str]:
    """Headers with credential values replaced by `[redacted]`: by name (`SECRET_NAME` or one of `names`,
    case-insensitive; OPENHUB_REDACT_HEADERS) or by a value that looks like a credential (`SECRET_VALUE`)."""
    extra = {n.lower() for n in names}
    return {name: REDACTED if SECRET_NAME.search(name) or name.lower() in extra or SECRET_VALUE.search(value)
            else value for name, value in headers}


def redact_body(body: bytes | None, content_type: str | None, mode: str = "fields") -> bytes | None:
    """A recorded body under OPENHUB_REDACT_BODIES `mode`; never raises.

    `fields`: secret-named values (`SECRET_NAME`) of a JSON body, at any depth, and of a form body
    (application/x-www-form-urlencoded) become `[redacted]`; any other or unparseable body is kept.
    `all`: only the body's length and content type are kept. `none`: the body as sent.
    """
    if not body or mode == "none":
        return body
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if mode == "all":
        return _summary(body, media)
    try:
        if media == "application/x-www-form-urlencoded":
            return _redact_form(body)
        if media.endswith("/json") or media.endswith("+json"):
            return _redact_json(body, media)
    except Exception:  # noqa: BLE001 - a body we cannot read is kept as it was, the step goes on
        return body
    return body


def _summary(body: bytes, media: str) -> bytes:
    return f"[{media + ' ' if media else ''}body of {len(body)} bytes redacted]".encode()


def _redact_json(body: bytes, media: str) -> bytes:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON after all, or nested past the parser's limit
        return body
    if not _redact_fields(document):
        return body  # nothing secret: recorded byte for byte, not re-encoded
    try:
        return json.dumps(document, ensure_ascii=False).encode()
    except RecursionError:  # it holds a secret but is too deep to encode again from here: keep none of it
        return _summary(body, media)


def _redact_fields(document: Any) -> bool:
    """Redact, in place, every secret-named object member (the whole member, whatever it holds); True if any.

    A loop rather than recursion: the parser accepts nesting as deep as Python's recursion limit, and a
    walk that recursed from further down the stack would run out where the parser did not."""
    changed, pending = False, [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if SECRET_NAME.search(key):
                    value[key], changed = REDACTED, True
                else:
                    pending.append(item)
        elif isinstance(value, list):
            pending.extend(value)
    return changed


def _redact_form(body: bytes) -> bytes:
    # Pair by pair, so what is not a secret is recorded exactly as it was sent.
    out = []
    for pair in body.split(b"&"):
        name, eq, _ = pair.partition(b"=")
        if eq and SECRET_NAME.search(unquote_plus(name.decode("latin-1"))):
            pair = name + b"=" + REDACTED.encode()
        out.append(pair)
    return b"&".join(out)
