"""HTTP steps: one declaration of how an external API's answers map onto step outcomes.

    billing = HttpCall(business_errors={409: "E410"}, reject={400, 404, 422}, record=True)

    @step
    def update_billing(ctx: StepContext) -> None:
        r = billing.post(ctx, f"{BILLING}/customers", json=ctx.payload)
        if r.is_success:
            ctx.custom_data["billing_id"] = r.json()["id"]

Every request carries `Idempotency-Key: ctx.idempotency_key`, `X-Correlation-Id` and, when the
message has one, `X-Process-Id` (an id with characters outside printable ASCII percent-encoded:
`header_value`). Answers become outcomes at this one boundary:

    timeout, connection error            -> TransientError, code TIMEOUT / CONNECTION (retried)
    5xx, 408, 425                        -> TransientError, code HTTP_<status> (retried)
    429 with Retry-After (seconds/date)  -> Postpone(delay), no failure counted; 429 without it: transient
    a code in `business_errors`          -> ctx.business_error(code, text); the response is returned
    any other 4xx (and `reject`)         -> Reject, code HTTP_<status>: the request itself is wrong, FAILED
                                            at once (openhub.core.failures, as for raise_for_status())
    2xx, 3xx                             -> the response is returned

With `record=True` each exchange (method, URL, status, redacted headers, bodies cut to
OPENHUB_HTTP_RECORD_BYTES, duration) is stored with the message; see `openhub.store.recordings`.
`record="headers"` stores the same without either body (a call whose bodies are all secret).
Each call holds a client of its process's alone while it is under way (`held_client`: as many clients as
calls in flight, each keeping its one keep-alive connection; a forked worker builds its own).
"""

from __future__ import annotations

import email.utils
import itertools
import json
import logging
import os
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, Literal
from urllib.parse import parse_qsl, quote

import httpx

from openhub.core import codes
from openhub.core.concurrency import green
from openhub.core.context import StepContext
from openhub.core.errors import ConfigurationError, Postpone, Reject, TransientError
from openhub.core.failures import RETRYABLE_4XX, error_code
from openhub.core.redact import redact_text, redact_url, remember, url_secrets
from openhub.core.secret_shapes import SECRET_VALUE, configured_names, is_secret_name
from openhub.store.db import store_now, utcnow
from openhub.store.recordings import Exchange, record_exchange

log = logging.getLogger("openhub.http")

_clients: dict[int, list[httpx.Client]] = {}
_clients_lock = threading.Lock()
_turn = itertools.count()
_TRANSIENT_STATUSES = {408, 429}
# httpcore's pool looks at every connection it holds for every request it assigns, and again when each answer
# is read (an idle one is polled: a syscall each): one client under `-P gevent -c 500` held ~500 connections,
# and that scan took half of a worker's CPU and stalled it for ~30 s under load (issue 42; bench/RESULTS.md).
# `pooled_client` goes round GREEN_SHARDS clients under gevent, so each pool holds a few dozen connections;
# HttpCall holds a client per call in flight (`held_client`), so each pool holds one.
GREEN_SHARDS = 16
# httpx's keep-alive expiry: a client no call took for that long has no connection worth keeping.
IDLE_CLOSE = 5.0
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=100)
_ssl_contexts: dict[int, ssl.SSLContext] = {}
_idle: dict[int, deque[tuple[float, httpx.Client]]] = {}  # pid -> (returned at, client) no call holds, oldest first


def _new_client() -> httpx.Client:
    """A client with the process's one TLS context: httpx builds one per client otherwise (the CA bundle read
    and parsed: ~60 ms of CPU per client, where a client per call in flight makes hundreds)."""
    context = _ssl_contexts.get(os.getpid())
    if context is None:
        context = _ssl_contexts[os.getpid()] = httpx.create_ssl_context()  # as httpx.Client(verify=True) does
    return httpx.Client(limits=_LIMITS, verify=context)


def pooled_client() -> httpx.Client:
    """One of the process's shared clients: keep-alive connections are reused across steps and messages.

    Their connections are not capped: the worker pool's concurrency bounds the calls in flight, and a
    cap below it (100 here once) held `-P gevent -c 500` to 100 calls, the others waiting for a
    connection and timing out in that wait. Under gevent each call takes the next of GREEN_SHARDS
    clients, round the list; elsewhere there is one. A step that can say when its call ends takes
    `held_client()` instead: its client's pool holds one connection, not a share of hundreds."""
    pid = os.getpid()
    clients = _clients.get(pid)
    if clients is None:
        with _clients_lock:
            clients = _clients.get(pid)
            if clients is None:
                shards = GREEN_SHARDS if green() else 1
                clients = _clients[pid] = [_new_client() for _ in range(shards)]
    return clients[next(_turn) % len(clients)]


@contextmanager
def held_client() -> Iterator[httpx.Client]:
    """A client of the process's that no other call uses until the block ends (HttpCall's, for each call):

        with held_client() as client:
            client.post(url, json=body).raise_for_status()

    The process keeps the clients its calls gave back and hands out the one given back last, so it holds as
    many as it had calls in flight at once, each with its one keep-alive connection: a request costs httpcore's
    pool a look at that connection, not at every connection of the process (`pooled_client` under gevent:
    a sixteenth of them). A client nobody took for IDLE_CLOSE seconds is closed as the next one comes back."""
    pid = os.getpid()
    idle = _idle.get(pid)
    if idle is None:
        idle = _idle.setdefault(pid, deque())
    try:
        client = idle.pop()[1]
    except IndexError:  # every client of the process is in a call
        client = _new_client()
    try:
        yield client
    finally:
        now = time.monotonic()
        idle.append((now, client))
        while True:
            try:
                returned = idle[0][0]
                if returned >= now - IDLE_CLOSE:
                    break
                stale = idle.popleft()[1]
            except IndexError:  # another thread took the last one meanwhile
                break
            stale.close()


def step_key_of(ctx: StepContext) -> str:
    """The step's key, recovered from its idempotency key `source/correlation/key[/generation]`."""
    prefix = f"{ctx.message.source_system}/{ctx.message.correlation_id}/"
    rest = ctx.idempotency_key.removeprefix(prefix)
    head, _, tail = rest.rpartition("/")
    return head if head and tail.isdigit() else rest


# Printable ASCII but `%`: what an id keeps as it is where it must be percent-encoded.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(text: str) -> str:
    """`text` (an id a source system gave) as an HTTP header value: as it is when it is printable ASCII,
    else percent-encoded (RFC 3986: the UTF-8 bytes of each other character, and `%` itself, as `%XX`),
    so `bestellung-ü-1` goes out as `bestellung-%C3%BC-1` instead of failing the step."""
    if text.isascii() and text.isprintable():
        return text
    return quote(text, safe=_HEADER_SAFE)


def retry_after(value: str | None, now: datetime | None = None) -> timedelta | None:
    """The delay a Retry-After header asks for (delta-seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return timedelta(seconds=int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(when - (now or datetime.now(timezone.utc)), timedelta(0))


class HttpCall:
    """How a step calls one HTTP API: status mapping, recording, timeout and default headers.

    Declare it once at module level (options are checked there, so a typo fails at import) and
    call `get/post/put/patch/delete/request(ctx, url, ...)` inside steps; keyword arguments go to
    `httpx.Client.request` (json=, content=, params=, headers=...).
    """

    def __init__(
        self,
        *,
        business_errors: Mapping[int, str] | None = None,
        reject: Iterable[int] = (),
        record: bool | Literal["headers"] = False,
        timeout: float | timedelta = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.business_errors = dict(business_errors or {})
        self.reject = frozenset(reject)
        for code in (*self.business_errors, *self.reject):
            if not isinstance(code, int) or not 400 <= code <= 499 or code in _TRANSIENT_STATUSES:
                raise ConfigurationError(f"HttpCall maps only 4xx codes other than 408/429 to outcomes, got {code!r}")
        both = set(self.business_errors) & self.reject
        if both:
            raise ConfigurationError(f"HttpCall: {sorted(both)} both a business error and a Reject")
        _check_record(record)
        self.record = record
        self.timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return (
            f"HttpCall(business_errors={self.business_errors}, reject={sorted(self.reject)}, "
            f"record={self.record}, timeout={self.timeout})"
        )

    def get(self, ctx: StepContext, url: str, **kwargs: Any) -> httpx.Response:
        """GET `url`; see `request`."""
        return self.request(ctx, "GET", url, **kwargs)

    def post(self, ctx: StepContext, url: str, **kwargs: Any) -> httpx.Response:
        """POST to `url`; see `request`."""
        return self.request(ctx, "POST", url, **kwargs)

    def put(self, ctx: StepContext, url: str, **kwargs: Any) -> httpx.Response:
        """PUT to `url`; see `request`."""
        return self.request(ctx, "PUT", url, **kwargs)

    def patch(self, ctx: StepContext, url: str, **kwargs: Any) -> httpx.Response:
        """PATCH `url`; see `request`."""
        return self.request(ctx, "PATCH", url, **kwargs)

    def delete(self, ctx: StepContext, url: str, **kwargs: Any) -> httpx.Response:
        """DELETE `url`; see `request`."""
        return self.request(ctx, "DELETE", url, **kwargs)

    def request(
        self, ctx: StepContext, method: str, url: str, *, record: bool | Literal["headers"] | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Send one request for the step and turn its answer into the step's outcome (module docstring)."""
        if record is not None:
            _check_record(record)
        headers = {**self.headers, **(kwargs.pop("headers", None) or {})}
        headers.setdefault("Idempotency-Key", ctx.idempotency_key)
        headers.setdefault("X-Correlation-Id", header_value(ctx.message.correlation_id))
        if ctx.message.process_id:
            headers.setdefault("X-Process-Id", header_value(ctx.message.process_id))
        kwargs.setdefault("timeout", self.timeout)
        with held_client() as client:
            req = client.build_request(method, url, headers=headers, **kwargs)
            _remember_secrets(req)  # whatever of them comes back (an echoed body, an exception) is redacted
            ctx.check_fence()  # right before the call: not sent by a process others may judge dead
            # The hub's time, in its store's records; a context outside a hub's run records nothing (`_record`).
            at = store_now(ctx.settings.database_url) if ctx.settings is not None else utcnow()
            started = time.perf_counter()
            answer = _send(client, req)
        # The client went back as the answer came: recording (a store write) holds none.
        if isinstance(answer, httpx.HTTPError):
            self._record(ctx, record, req, None, f"{type(answer).__name__}: {answer}", started, at)
            raise _transient(
                redact_text(f"{method} {url}: {type(answer).__name__}: {answer}") or "", error_code(answer)
            ) from answer
        response = answer
        self._record(ctx, record, req, response, None, started, at)
        return self._outcome(ctx, response)

    def _outcome(self, ctx: StepContext, response: httpx.Response) -> httpx.Response:
        status = response.status_code
        if status < 400:
            return response
        what = f"{response.request.method} {redact_url(str(response.request.url))} answered {status}"
        text = f"{what}: {_short(redact_text(response.text[:_ECHO_READ]) or '')}"  # redacted before it is cut
        if status == 429:
            delay = retry_after(response.headers.get("Retry-After"))
            if delay is not None:
                raise Postpone(delay, reason=f"{what}, Retry-After {response.headers['Retry-After']}")
        if status in self.business_errors:
            ctx.business_error(self.business_errors[status], text)
            return response
        if status in self.reject or (status < 500 and status not in RETRYABLE_4XX):
            raise Reject(text, code=codes.http(status))
        raise _transient(text, codes.http(status))

    def _record(
        self,
        ctx: StepContext,
        record: bool | str | None,
        request: httpx.Request,
        response: httpx.Response | None,
        error: str | None,
        started: float,
        at: datetime,
    ) -> None:
        record = self.record if record is None else record
        if not record or ctx.settings is None:  # no hub's run: no store to record into
            return
        bodies = record != "headers"
        exchange = Exchange(
            message_id=ctx.message.id,
            step_key=step_key_of(ctx),
            attempt=ctx.attempt,
            method=request.method,
            url=str(request.url),
            status=response.status_code if response is not None else None,
            error=error,
            request_headers=dict(request.headers),
            request_body=_request_body(request) if bodies else None,
            response_headers=dict(response.headers) if response is not None else {},
            response_body=response.content if response is not None and bodies else None,
            duration_ms=round((time.perf_counter() - started) * 1000),
            at=at,
        )
        try:
            record_exchange(exchange, ctx.settings)
        except Exception as exc:
            ctx.log.warning(
                "could not record the HTTP exchange %s %s: %s", request.method, redact_url(str(request.url)), exc
            )


_ECHO_READ = 20_000  # characters of an error answer's body read for its one-line text
_PARSE_SENT = 65_536  # bytes of a request body read for the secret fields it sends
# A body holding none of these holds no secret name (openhub.core.secret_shapes.is_secret_name): not parsed at all.
_SECRET_MARKS = re.compile(
    rb"(?i)token|secret|pass|pwd|pin|otp|jwt|key|session|sig|subscription|credential|auth"
    rb"|cookie"
)


def _remember_sent_fields(content: bytes, content_type: str) -> None:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/x-www-form-urlencoded":
        remember(*(v for n, v in parse_qsl(content.decode("latin-1"), keep_blank_values=True) if is_secret_name(n)))
    elif media.endswith("/json") or media.endswith("+json"):
        pending = [json.loads(content)]
        while pending:
            value = pending.pop()
            if isinstance(value, dict):
                for key, item in value.items():
                    if is_secret_name(key) and not isinstance(item, (dict, list)):
                        remember(item)
                    else:
                        pending.append(item)
            elif isinstance(value, list):
                pending.extend(value)


def _remember_secrets(request: httpx.Request) -> None:
    """Note, for the step's redaction (openhub.core.redact.remember), the secrets this request carries: secret-named
    or credential-looking header values, the URL's (`url_secrets`: password, secret query values, a webhook
    path's token), and a small JSON or form body's secret-named fields. Never raises."""
    try:
        remember(*(v for n, v in request.headers.items() if is_secret_name(n) or SECRET_VALUE.search(v)))
        remember(*url_secrets(str(request.url)))
        content = request.content if isinstance(request.stream, httpx.ByteStream) else b""
        if content and len(content) <= _PARSE_SENT and (_SECRET_MARKS.search(content) or configured_names()):
            _remember_sent_fields(content, request.headers.get("content-type", ""))
    except Exception:
        log.debug("could not read the request's secrets for redaction", exc_info=True)


def _send(client: httpx.Client, request: httpx.Request) -> httpx.Response | httpx.HTTPError:
    """The answer, read whole, or the error that came instead (a timeout, a refused or reset connection, a
    protocol error)."""
    try:
        response = client.send(request)
        response.read()
    except httpx.HTTPError as exc:
        return exc
    return response


def _check_record(record: object) -> None:
    if record not in (True, False, "headers"):
        raise ConfigurationError(f"HttpCall record= takes True, False or 'headers', got {record!r}")


def _request_body(request: httpx.Request) -> bytes | None:
    try:
        return request.content or None
    except httpx.RequestNotRead:  # a streamed upload: not kept
        return b"[streamed body not recorded]"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _transient(text: str, code: str) -> TransientError:
    error = TransientError(text)
    error.code = code  # type: ignore[attr-defined]  # read by openhub.core.failures.error_code
    return error
