"""Secrets kept out of what the hub stores, logs, exports and sends on: one place that redacts them.

The hub's outbound credentials (a URL's `user:password@`, an `?api_key=`, a webhook URL's path token, a
header such as `Authorization` or `X-Functions-Key`, a body's `client_secret`) and the fields a route
marks secret must never reach a recorded exchange, an error text (a message's `failed_error`, an
external call's or a confirmation's `last_error`, a business error's text), a history detail, a log
line, an exported span, or what confirmers, webhooks and source systems are told. One pass,
`redact_text`, is applied where text leaves the hub's hands:

- every text column the store writes (`openhub.store.columns.Redacted` and `RedactedJson`: the column type
  redacts whatever module writes it);
- every log record of the hub's processes (`openhub.core.logs` installs `RedactingFilter`);
- every span before it is exported (`openhub.core.tracing` wraps its span processors: attributes, events,
  status descriptions);
- and, where a text is built, already there (HttpCall redacts a response body before cutting it).

What `redact_text` takes out:
- URLs: userinfo, query and fragment values of secret names (`?token=`, `#access_token=`), and path
  secrets: webhook URLs' tokens (Slack, Teams, Discord, Telegram's `bot<token>`) and any path segment
  shaped like a token;
- values of secret names wherever a text pairs them (`password=x`, `"pwd": "x"`, `'pin': 'x'`,
  `X-Hub-Key: x`), and name/value pairs (`{"name": "password", "value": "x"}`);
- values shaped like credentials whatever they are called: an HTTP auth scheme and its credentials
  (`Bearer …`), a JWT, well-known key prefixes (`sk_live_`, `ghp_`, `xoxb-`, `AKIA`, `whsec_`), and
  long high-entropy tokens (24+ characters mixing upper case, lower case and digits);
- the values the current step sent as secrets (`remember`: HttpCall notes its secret headers, query
  values and body fields; a route's `secret_fields` are noted from the payload), whatever shape and
  wherever they come back (an echoed body, `Illegal header value b'…\\n'`).

A secret name (`is_secret_name`; it and the credentials' shapes are recognised in secret_shapes.py): one
holding token, secret, passw(or)d, passphrase, api-key, access-key, private-key, session, signature,
subscription, credential, auth or cookie; or a word of it (camelCase or separated) pass, pwd, pin, otp, jwt;
or one ending in the word key (`X-Functions-Key`, `privateKey`; not `Idempotency-Key`); or `sig`, `key` (and,
in a URL, `code`); or one of OPENHUB_REDACT_NAMES (and OPENHUB_REDACT_HEADERS): names are compared
case-insensitively, and the configured ones only add.

Nothing here raises: a text the pass cannot read is withheld, not kept (`[redaction failed: …]`), and a
body the hub cannot parse is kept for the text pass, so redaction never turns a good call into a
failed step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

from openhub.core.secret_shapes import PREFIXED_TOKEN, SECRET_VALUE, looks_like_a_token, redact_shapes
from openhub.core.secret_shapes import REDACTED as REDACTED  # what stands for a secret, still importable from here
from openhub.core.secret_shapes import configured_names as configured_names
from openhub.core.secret_shapes import is_secret_name as is_secret_name

IN_URL = "***"  # what stands for a secret in a URL (brackets would make it an IPv6 host)
_SECRET_IN_URL = frozenset({"code"})  # an OAuth authorization code (`Location: …?code=`); elsewhere an error code

# --- values the current step or send knows to be secret ----------------------------------------------------
_known: ContextVar[set[str] | None] = ContextVar("openhub_known_secrets", default=None)
# An auth header's scheme: its credentials are noted without it too.
_SCHEME = re.compile(r"^\s*(?:bearer|basic|digest|negotiate|token)\s+", re.IGNORECASE)
MIN_KNOWN = 4  # shorter values (a 3-character "pin") would blank every such run of any text


@contextmanager
def secrets_scope(values: Iterable[Any] = ()) -> Iterator[None]:
    """Within the block (a step's run), `values` and what `remember` notes are redacted from every text."""
    token = _known.set(set())
    try:
        remember(*values)
        yield
    finally:
        _known.reset(token)


def remember(*values: Any) -> None:
    """Note values sent as secrets in the current `secrets_scope` (nothing outside one); an auth header's
    credentials are noted without their scheme too."""
    known = _known.get()
    if known is None:
        return
    for value in values:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            continue
        text = str(value).strip()
        for part in (text, *_SCHEME.sub("", text).split()):
            if len(part) >= MIN_KNOWN:
                known.add(part)


# --- URLs ---------------------------------------------------------------------------------------------------
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]+")
# Webhook URLs whose path is the credential: everything after these prefixes goes.
_PATH_SECRETS = re.compile(r"^(?:/services/|/webhookb2/|/webhook/|/api/webhooks/|/workflows/)", re.IGNORECASE)
_BOT = re.compile(r"^bot\d+:[A-Za-z0-9_-]+$")


def redact_url(url: str) -> str:
    """`url` without its userinfo (`user:password@`), secret-named query and fragment values (`***`), a
    webhook URL's path token, or a path segment shaped like a token."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return IN_URL
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{IN_URL}@{netloc.rsplit('@', 1)[1]}"
    path = _redact_path(parts.path)
    query = _redact_query(parts.query)
    fragment = _redact_query(parts.fragment) if "=" in parts.fragment else _redact_segment(parts.fragment)
    if (netloc, path, query, fragment) == (parts.netloc, parts.path, parts.query, parts.fragment):
        return url
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def url_secrets(url: str) -> list[str]:
    """The parts of `url` that `redact_url` takes out (its password, secret query and fragment values, a
    webhook path's token and token-shaped segments): what a step sending to it must never see come back."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return []
    prefix = _PATH_SECRETS.match(parts.path)
    if prefix:
        found += [s for s in parts.path[prefix.end() :].split("/") if s]
    found += [s.removeprefix("bot") for s in parts.path.split("/") if _redact_segment(s) != s]
    for query in (parts.query, parts.fragment if "=" in parts.fragment else ""):
        found += [
            v for n, v in parse_qsl(query, keep_blank_values=True) if n.lower() in _SECRET_IN_URL or is_secret_name(n)
        ]
    return found


def _redact_path(path: str) -> str:
    prefix = _PATH_SECRETS.match(path)
    if prefix:
        return prefix.group() + IN_URL
    return "/".join(_redact_segment(segment) for segment in path.split("/"))


def _redact_segment(segment: str) -> str:
    if _BOT.match(segment):
        return "bot" + IN_URL
    return IN_URL if looks_like_a_token(segment) or PREFIXED_TOKEN.fullmatch(segment) else segment


def _redact_query(query: str) -> str:
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    secret = [(n, v, n.lower() in _SECRET_IN_URL or is_secret_name(n) or _secret_value(v)) for n, v in pairs]
    if not any(hidden for _, _, hidden in secret):
        return query
    return urlencode([(n, IN_URL if hidden else v) for n, v, hidden in secret], safe="*")


def _secret_value(value: str) -> bool:
    return bool(SECRET_VALUE.search(value)) or looks_like_a_token(value) or value in (_known.get() or ())


# --- text ---------------------------------------------------------------------------------------------------
# `name: value`, `name=value`, `"name": "value"`, `'name': 'value'` (a JSON body, a form, a header line,
# a Python repr in a traceback); the value quoted (to its closing quote, or the end when it was cut), or
# bare up to a delimiter.
# A name: quoted (its quote may be escaped, `\\"pwd\\"` in a JSON body quoted inside a JSON text) or bare.
_NAME_SEP = re.compile(
    r"(?P<q>\\*[\"'])(?P<quoted>[^\"'\\\n]{1,80})(?P=q)(?P<qsep>\s*[:=]\s*)"
    r"|(?<![A-Za-z0-9_.-])(?P<bare>[A-Za-z][A-Za-z0-9_.-]{0,79}+)(?P<sep>\s*[:=]\s*)"
)
_OPENING = re.compile(r"b?(\\*[\"'])")
_IN_QUOTES = {quote: re.compile(rf"(?:[^\\\n{quote}]|\\.)*") for quote in "\"'"}
_BARE_VALUE = re.compile(r"(?:(?i:bearer|basic|digest|negotiate|token)\s+)?[^\s,;&\"'<>(){}\[\]\\]+")
# {"name": "password", "value": "..."} (either order), as forms and settings APIs write them.
_NAME_VALUE = re.compile(r"\{[^{}]{0,2000}\}")
_NAMED = re.compile(r"\\*[\"'](?:name|key|field)\\*[\"']\s*:\s*\\*[\"'](?P<name>[^\"'\\]{1,80})\\*[\"']", re.IGNORECASE)
_VALUE = re.compile(r"(?P<head>(?P<q>\\*[\"'])value(?P=q)\s*:\s*)")


def redact_text(text: str | None) -> str | None:
    """`text` (an error, a traceback, a body, a log line) with every secret the module docstring lists
    replaced: URLs as `redact_url` does, secret-named values, name/value pairs, credential-shaped values
    and the values the current scope knows. Never raises."""
    if not text:
        return text
    try:
        return _redact(text)
    except Exception:
        return f"[redaction failed: {len(text)} characters withheld]"


def _redact(text: str) -> str:
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m.group()), text)
    text = _pairs(text)
    if "value" in text.lower():
        text = _NAME_VALUE.sub(_name_value, text)
    text = redact_shapes(text)
    for value in sorted(_known.get() or (), key=len, reverse=True):  # longest first: a part within another
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def _pairs(text: str) -> str:
    """Secret-named values in `text` redacted. A name that is not secret consumes nothing after its
    separator, so `failed: password=x` finds `password` too."""
    out, done, at = [], 0, 0
    while (named := _NAME_SEP.search(text, at)) is not None:
        at = named.end()
        if not is_secret_name(named["quoted"] or named["bare"]):
            continue
        start, end, quote = _value_at(text, at)
        if end <= start or text[start:end] in (REDACTED, IN_URL):
            continue
        out += [text[done:start], REDACTED]
        done = at = end
    return "".join(out) + text[done:] if out else text


def _value_at(text: str, at: int) -> tuple[int, int, str]:
    """Where the value starting at `at` lies, inside its quotes if it has some (the closing one may be
    missing: a cut text); and its quote."""
    opening = _OPENING.match(text, at)
    if opening is not None:
        quote = opening[1]
        start = opening.end()
        if len(quote) == 1:  # a plain string: `\"` inside it is an escaped quote, not its end
            end = _IN_QUOTES[quote].match(text, start).end()  # type: ignore[union-attr]  # always matches
        else:  # quoted inside a quoted text: ends at the same escaped quote
            found = text.find(quote, start)
            line = text.find("\n", start)
            end = min(x for x in (found, line, len(text)) if x >= 0)
        return start, min(end, start + 2000), quote
    bare = _BARE_VALUE.match(text, at)
    return at, bare.end() if bare else at, ""


def _name_value(match: re.Match[str]) -> str:
    obj = match.group()
    named = _NAMED.search(obj)
    if named is None or not is_secret_name(named["name"]):
        return obj
    out, done = [], 0
    for value in _VALUE.finditer(obj):
        start, end, _quote = _value_at(obj, value.end())
        if end > start:
            out += [obj[done:start], REDACTED]
            done = end
    return "".join(out) + obj[done:]


# --- headers and bodies of recorded exchanges ----------------------------------------------------------
def redact_headers(headers: Iterable[tuple[str, str]], names: Iterable[str] = ()) -> dict[str, str]:
    """Headers with credential values replaced by `[redacted]`: by name (`is_secret_name`, or one of `names`,
    case-insensitive; OPENHUB_REDACT_HEADERS) or by a value that looks like a credential (`SECRET_VALUE`);
    any other value passes `redact_text` (a `Location: …?code=` URL, a token inside)."""
    extra = {n.lower() for n in names}
    return {
        name: REDACTED if is_secret_name(name, extra) or SECRET_VALUE.search(value) else redact_text(value) or value
        for name, value in headers
    }


def redact_body(body: bytes | None, content_type: str | None, mode: str = "fields") -> bytes | None:
    """A recorded body under OPENHUB_REDACT_BODIES `mode`; never raises.

    `fields`: secret-named values (`is_secret_name`) of a JSON body, at any depth, name/value pairs
    (`{"name": "password", "value": …}`) and secret-named fields of a form body
    (application/x-www-form-urlencoded) become `[redacted]`; any other or unparseable body is kept (the
    stored text still passes `redact_text`). `all`: only the body's length and content type are kept.
    `none`: the body as sent (the stored text still passes `redact_text`).
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
    except Exception:
        return body
    return body


def _summary(body: bytes, media: str) -> bytes:
    return f"[{media + ' ' if media else ''}body of {len(body)} bytes redacted]".encode()


def _redact_json(body: bytes, media: str) -> bytes:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON after all, or nested past the parser's limit
        return body
    if not redact_fields(document):
        return body  # nothing secret: recorded byte for byte, not re-encoded
    try:
        return json.dumps(document, ensure_ascii=False).encode()
    except RecursionError:  # it holds a secret but is too deep to encode again from here: keep none of it
        return _summary(body, media)


def redact_fields(document: Any) -> bool:
    """Redact, in place, every secret-named object member (the whole member, whatever it holds) and the
    value of every name/value pair naming a secret; True if any.

    A loop rather than recursion: the parser accepts nesting as deep as Python's recursion limit, and a
    walk that recursed from further down the stack would run out where the parser did not."""
    changed, pending = False, [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            named = next((value[k] for k in ("name", "key", "field", "Name", "Key") if k in value), None)
            for key, item in value.items():
                if is_secret_name(key) or (key.lower() == "value" and isinstance(named, str) and is_secret_name(named)):
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
        if eq and is_secret_name(unquote_plus(name.decode("latin-1"))):
            pair = name + b"=" + REDACTED.encode()
        out.append(pair)
    return b"&".join(out)


def redact_json_text(text: str | None) -> str | None:
    """A stored JSON text (headers, business errors) with every string in it passed through `redact_text`
    and secret-named members redacted; kept as it is when nothing changes, withheld if unreadable."""
    if not text:
        return text
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return redact_text(text)
    changed = redact_fields(document)
    pending = [document]
    while pending:
        value = pending.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in list(items):
            if isinstance(item, str):
                clean = redact_text(item)
                if clean != item:
                    value[key], changed = clean, True
            elif isinstance(item, (dict, list)):
                pending.append(item)
    return json.dumps(document, ensure_ascii=False) if changed else text


def redact_mapping(values: Mapping[str, Any], keep: Iterable[str] = ()) -> dict[str, Any]:
    """Attribute-like `values` (a span's, an event's) with every text passed through `redact_text`,
    secret-named keys redacted, and the keys in `keep` left as they are."""
    kept = set(keep)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in kept:
            out[key] = value
        elif is_secret_name(key.rsplit(".", 1)[-1]) and isinstance(value, str):
            out[key] = REDACTED
        elif isinstance(value, str):
            out[key] = redact_text(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
            out[key] = type(value)(redact_text(v) if isinstance(v, str) else v for v in value)
        else:
            out[key] = value
    return out
