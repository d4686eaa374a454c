"""Reading a request body safely: size limit while streaming, and the media types the hub takes.

The limit is checked against Content-Length before anything is read and again while the body
streams in, so an oversized or lying request is refused (413) without ever being held whole.
JSON bodies are parsed; text/plain and XML bodies become a JSON string; anything else is 415.
Only the charsets in `CHARSETS` are decoded. Decoding and parsing are CPU work that grows with
the body: callers run them in a worker thread (`run_in_threadpool`), never on the event loop.
"""

from __future__ import annotations

import codecs
import json
from typing import Any

from fastapi import Request

from openhub.api.problems import ApiError

TEXT_TYPES = {"text/plain", "text/xml", "application/xml"}
# Charsets a body may declare, by Python codec name. Others are refused (415): some codecs are
# slow on hostile input (punycode is quadratic) and none is needed by a source system.
CHARSETS = {
    "utf-8",
    "utf-8-sig",
    "utf-16",
    "utf-16-le",
    "utf-16-be",
    "utf-32",
    "utf-32-le",
    "utf-32-be",
    "ascii",
    "latin-1",
    "iso8859-1",
    "iso8859-15",
    "cp1250",
    "cp1252",
}


def decode_text(data: bytes, charset: str) -> str:
    """The body's text in its declared charset: 415 for a charset not allowed, 400 when it does not decode."""
    try:
        codec = codecs.lookup(charset).name
    except (LookupError, ValueError):
        codec = None
    if codec not in CHARSETS:
        raise ApiError(415, f"charset {charset[:40]!r} is not accepted: use utf-8 (or utf-16, utf-32, latin-1)")
    try:
        return data.decode(codec)
    except UnicodeError:
        raise ApiError(400, f"body is not valid {codec}") from None


def media_type(request: Request) -> tuple[str, str]:
    """(media type, charset) of the request; 415 when it is missing."""
    raw = request.headers.get("content-type")
    if not raw:
        raise ApiError(415, "Content-Type is required: application/json, text/plain or application/xml")
    parts = [p.strip() for p in raw.split(";")]
    mime = parts[0].lower()
    charset = "utf-8"
    for p in parts[1:]:
        if p.lower().startswith("charset="):
            charset = p.split("=", 1)[1].strip().strip('"') or "utf-8"
    return mime, charset


def is_json(mime: str) -> bool:
    """application/json or a +json suffix type."""
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def is_text(mime: str) -> bool:
    """Plain text or XML (stored as a JSON string)."""
    return mime in TEXT_TYPES or (mime.startswith("application/") and mime.endswith("+xml"))


async def read_limited(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise ApiError(413, f"body of {int(declared)} bytes is over the limit of {limit} bytes")
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _storable(value: Any) -> Any:
    # Lone surrogates (legal in JSON text, "\ud800") cannot be stored as UTF-8.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "payload contains unpaired UTF-16 surrogates, which cannot be stored") from None
    except (RecursionError, ValueError):
        raise ApiError(400, "payload is nested too deeply") from None
    return value


def decode_json(data: bytes, charset: str = "utf-8") -> Any:
    """Parse a JSON body; 400 when it is not JSON."""
    text = decode_text(data, charset)
    if not text.strip():
        raise ApiError(400, "body is empty: send the payload as JSON")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ApiError(400, "payload is nested too deeply") from None
    except ValueError as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    return _storable(value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_payload(data: bytes, mime: str, charset: str) -> Any:
    """The payload a body carries: parsed JSON, or the text of a text/XML body; 415 otherwise."""
    if is_json(mime):
        return decode_json(data, charset)
    if is_text(mime):
        return _storable(decode_text(data, charset))
    raise ApiError(415, f"unsupported media type {mime!r}: use application/json, text/plain or application/xml")
