"""The stock state hook: a webhook (OPENHUB_WEBHOOK_URL) told of every message entering one of
OPENHUB_WEBHOOK_STATES (default FAILED), with the message as JSON. A refused or failed POST is
retried like a confirmation, then parked for an operator.

Every POST has an overall deadline, OPENHUB_CONFIRM_TIMEOUT (30 s): httpx's own timeouts are per
read, so a receiver sending one byte every few seconds held a worker for minutes. `post_within`
enforces it at the socket (each connect, read and write may take only what is left of the
deadline); confirmers may use it for their own POSTs.

Every POST of the stock webhook is signed the Standard Webhooks way (openhub.core.signing) with the secret of
whom it is for: a state hook's (the operators') with OPENHUB_WEBHOOK_SECRET, a confirmation's with its
source system's own, OPENHUB_CONFIRM_SECRETS (never the operators': a source system holding it could
forge every other system's confirmations and the operators' alerts), a hook given `secret=` with that.
Its `webhook-id` is the notification's random `delivery_key`, the same on every retry. `verify_signature`
is what a receiver checks it with; `send_outcome` and `post_json` sign a confirmer's own POST the same way.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import httpcore
import httpx

from openhub.core.config import Settings
from openhub.core.context import Outcome
from openhub.core.errors import ConfigurationError
from openhub.core.redact import redact_url
from openhub.core.signing import ReplayCache, secret_keys, signature_headers, verify_signature

__all__ = ["ReplayCache", "post_json", "post_within", "send_outcome", "verify_signature", "webhook"]


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write gets at most the time left before `deadline`."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float, budget: float) -> None:
        self._inner, self._deadline, self._budget = inner, deadline, budget

    def _left(self, timeout: float | None, error: type[Exception]) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise error(f"the send did not finish within its overall deadline of {self._budget:.1f} s")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Read, waiting no longer than the deadline allows."""
        return self._inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Write, waiting no longer than the deadline allows."""
        self._inner.write(buffer, self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        """Close the connection."""
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        """Upgrade to TLS within the deadline; the TLS stream keeps it."""
        inner = self._inner.start_tls(ssl_context, server_hostname, self._left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner, self._deadline, self._budget)

    def get_extra_info(self, info: str) -> Any:
        """What the underlying connection says."""
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    def __init__(self, deadline: float, budget: float) -> None:
        self._deadline, self._budget = deadline, budget

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout(
                f"the send did not finish within its overall deadline of {self._budget:.1f} s"
            )
        stream = super().connect_tcp(
            host, port, left if timeout is None else min(timeout, left), local_address, socket_options
        )
        return _DeadlineStream(stream, self._deadline, self._budget)


def post_within(url: str, seconds: float, **kwargs: Any) -> httpx.Response:
    """POST to `url` (keyword arguments as for `httpx.post`) and read the whole answer within
    `seconds` of wall-clock time, whatever the receiver does; else httpx.TimeoutException.
    A non-2xx answer raises httpx.HTTPStatusError. No connection is reused between calls."""
    https = url.lower().startswith("https:")
    # TLS set up only for https: loading the CA bundle took 0.1 s of each plain-http POST (twice: here and below),
    # a tenth of a second per confirmation on a loopback or in-cluster receiver. (No redirect is followed.)
    transport = httpx.HTTPTransport(verify=https)
    # httpx has no public hook for its network backend: the pool is rebuilt around ours, with
    # httpx's own TLS context, so that every socket operation is bounded by the deadline.
    tls = httpx.create_ssl_context() if https else None
    transport._pool = httpcore.ConnectionPool(
        ssl_context=tls, max_connections=1, network_backend=_DeadlineBackend(time.monotonic() + seconds, seconds)
    )
    with httpx.Client(transport=transport, timeout=seconds) as client:
        from openhub.store.workers import check_fence  # the store's modules: only where a hub sends

        check_fence()  # right before the send: none by a process others may judge dead (openhub.store.workers)
        try:
            response = client.post(url, **kwargs)
        except httpx.TimeoutException as exc:  # say which timeout: the overall one, not a read's
            raise type(exc)(
                f"POST {url} did not finish within its overall deadline of {seconds:.1f} s: {exc}", request=exc.request
            ) from exc
        return response.raise_for_status()


def post_json(
    url: str,
    seconds: float,
    payload: Any,
    webhook_id: str,
    secret: str | None = None,
    *,
    settings: Settings | None = None,
) -> httpx.Response:
    """POST `payload` as JSON to `url` within `seconds` (as `post_within`), with `webhook_id` as its
    Idempotency-Key and the Standard Webhooks headers signing the exact bytes sent with `secret`
    (space-separated secrets, "" for none) or, without it, the OPENHUB_WEBHOOK_SECRET of the hub whose
    `settings` are given (a confirmer's `outcome.settings`): the operators' hooks' secret. One of the two is
    needed. A confirmation goes with `send_outcome`, signed with its source system's own. Give one id per
    event, the same on every retry of it (`outcome.webhook_id` is one)."""
    if secret is not None:
        keys = secret_keys(secret, strong=True)
    elif settings is not None:
        keys = settings.webhook_secrets
    else:
        raise TypeError("post_json needs a `secret` or the sending hub's `settings` (a confirmer's outcome.settings)")
    return post_signed(url, seconds, payload, webhook_id, keys)


def post_signed(
    url: str,
    seconds: float,
    payload: Any,
    webhook_id: str,
    keys: tuple[bytes, ...],
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    # Serialised once: the signature covers these bytes, which is what the receiver reads.
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {
        **(extra or {}),
        "Content-Type": "application/json",
        "Idempotency-Key": webhook_id,
        **signature_headers(keys, webhook_id, int(time.time()), body),
    }  # signed when sent, per attempt
    return post_within(url, seconds, content=body, headers=headers)


def settings_of(outcome: Outcome) -> Settings:
    """The settings a notification is sent by: those of the hub sending it (`outcome.settings`, which the
    sender, openhub.outbound.confirm, gives it; an Outcome built elsewhere is given them by its builder)."""
    if outcome.settings is None:
        raise ConfigurationError(
            "this Outcome carries no settings: the stock webhook and confirmer sign and time a notification by"
            " the sending hub's (build it with Outcome(..., settings=hub.settings))"
        )
    return outcome.settings


def signing_keys(outcome: Outcome) -> tuple[bytes, ...]:
    """The keys a notification is signed with: a state hook's, the operators' (OPENHUB_WEBHOOK_SECRET); a
    confirmation's, its source system's (OPENHUB_CONFIRM_SECRETS). A source system without its own while the
    operators' is set is a ConfigurationError (the send fails, visibly): unsigned, it would look signed to
    nobody, and the operators' secret must never reach a source system."""
    settings = settings_of(outcome)
    if outcome.hook is not None:
        return settings.webhook_secrets
    system = outcome.message.source_system
    keys = settings.confirm_secrets.get(system, ())
    if not keys and settings.webhook_secrets:
        raise ConfigurationError(
            f"no OPENHUB_CONFIRM_SECRETS secret for source system {system}: a confirmation is "
            "signed with its source system's own secret, never with OPENHUB_WEBHOOK_SECRET "
            "(the operators' hooks'), which would let one system forge the others'"
        )
    return keys


def send_outcome(url: str, outcome: Outcome, seconds: float | None = None, secret: str | None = None) -> httpx.Response:
    """POST `outcome.as_dict()` to `url` within `seconds` (default OPENHUB_CONFIRM_TIMEOUT), its
    `webhook-id` and Idempotency-Key `outcome.webhook_id`, signed with `secret` if given ("" for none),
    else as `signing_keys` says: what the stock webhook does, for a confirmer's own POST."""
    keys = signing_keys(outcome) if secret is None else secret_keys(secret, strong=True)
    if seconds is None:
        seconds = settings_of(outcome).confirm_timeout.total_seconds()
    return post_signed(url, seconds, outcome.as_dict(), outcome.webhook_id, keys)


def webhook(url: str, seconds: float = 30.0, secret: str | None = None) -> Callable[[Outcome], None]:
    """A state hook (or confirmer) that POSTs `outcome.as_dict()` to `url` within `seconds`
    (OPENHUB_CONFIRM_TIMEOUT), signed as `send_outcome` says (the operators' secret for a hook, the
    source system's for a confirmation) or with this hook's own `secret` ("" for unsigned); anything
    but a 2xx answer in time is a failure."""
    if secret:  # a malformed or weak one fails when declared
        secret_keys(secret, f"the secret of the webhook to {redact_url(url)}", strong=True)

    def notify(outcome: Outcome) -> None:
        send_outcome(url, outcome, seconds, secret)

    notify.__qualname__ = notify.__name__ = "webhook"
    return notify
