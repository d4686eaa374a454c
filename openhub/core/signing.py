"""Standard Webhooks signatures (https://www.standardwebhooks.com/): how the stock webhook signs what
it POSTs, and how a receiver checks it.

A POST carries `webhook-id` (its Idempotency-Key, the same on every retry of one notification),
`webhook-timestamp` (unix seconds when it was sent) and `webhook-signature`: one `v1,<base64>` per
secret, space-separated, each the HMAC-SHA256 under that secret of `{id}.{timestamp}.{body}` over
the exact bytes of the body. Two secrets during a rotation give two signatures; either verifies.

A secret is given in the Standard Webhooks form `whsec_<base64>` (the key is the decoded bytes) or
as a plain string (the key is its UTF-8 bytes). A secret the hub signs with must be strong, as API
keys are: at least MIN_SECRET_CHARS characters (after `whsec_`) and not a `change-me` placeholder.

A receiver refuses a replay (the very request sent again, inside the timestamp tolerance) by giving
`verify_signature` a `ReplayCache`; the hub's own retries are new requests (a new timestamp and
signature, the same `webhook-id`) and pass, for the receiver to dedupe by `webhook-id`.
This module loads no HTTP library: settings use it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Callable, Protocol

from openhub.core.errors import ConfigurationError, WebhookSignatureError

PREFIX = "whsec_"
ID, TIMESTAMP, SIGNATURE = "webhook-id", "webhook-timestamp", "webhook-signature"
MIN_SECRET_CHARS = 32  # as for API keys (openhub.api.auth); after whsec_, 32 base64 characters are 24 bytes
PLACEHOLDER = "change-me"  # what the example files hold


def secret_keys(
    secrets: str | Iterable[str], name: str = "the webhook secret", strong: bool = False
) -> tuple[bytes, ...]:
    """The HMAC keys of `secrets` (a string of space-separated secrets, or several strings).

    A malformed `whsec_` secret is a ConfigurationError naming `name`, never the secret itself; so,
    with `strong` (a secret the hub signs with), is one shorter than MIN_SECRET_CHARS characters or
    holding the example files' `change-me` placeholder."""
    given = secrets.split() if isinstance(secrets, str) else [s for raw in secrets for s in raw.split()]
    keys = []
    for position, secret in enumerate(given, 1):
        if secret.startswith(PREFIX):
            encoded = secret[len(PREFIX) :]
            try:  # padding forgiven, as the reference libraries do: some issuers drop it
                key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise ConfigurationError(
                    f"{name}: secret {position} starts with {PREFIX} but the rest is not base64"
                ) from None
        else:
            key = secret.encode()
        if not key:
            raise ConfigurationError(f"{name}: secret {position} is empty")
        if strong and PLACEHOLDER in secret.lower():
            raise ConfigurationError(f"{name}: secret {position} is the example placeholder ({PLACEHOLDER}…)")
        if strong and len(secret.removeprefix(PREFIX)) < MIN_SECRET_CHARS:
            raise ConfigurationError(
                f"{name}: secret {position} is shorter than {MIN_SECRET_CHARS} characters "
                f"(e.g. {PREFIX} and the base64 of 32 random bytes)"
            )
        keys.append(key)
    return tuple(keys)


def _signature(key: bytes, webhook_id: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def signature_headers(keys: Iterable[bytes], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers signing `body` with each key (none when there is no key)."""
    signatures = " ".join(f"v1,{_signature(key, webhook_id, str(timestamp), body)}" for key in keys)
    if not signatures:
        return {}
    return {ID: webhook_id, TIMESTAMP: str(timestamp), SIGNATURE: signatures}


class ReplayCache:
    """The signed requests a receiver has already taken, for `verify_signature(..., replays=cache)` to
    refuse the same one sent again while its timestamp is still within the tolerance (after that the
    timestamp check refuses it). In memory, per receiver process, thread-safe; at most `capacity`
    requests are kept (the oldest go first). Receivers running several processes share one through
    their own store: any object with this `first_time` method (Redis: `SET key 1 NX EXAT until`) does.
    """

    def __init__(self, capacity: int = 100_000, clock: Callable[[], float] = time.time) -> None:
        self.capacity, self.clock = capacity, clock
        self._until: dict[str, float] = {}  # request -> when it may be forgotten, oldest first
        self._lock = threading.Lock()

    def first_time(self, key: str, until: float) -> bool:
        """Note request `key` until `until` (unix seconds); False when it was noted already and is not over."""
        now = self.clock()
        with self._lock:
            seen = self._until.get(key)
            if seen is not None and seen > now:
                return False
            self._until.pop(key, None)
            self._until[key] = until
            while len(self._until) > self.capacity or (self._until and next(iter(self._until.values())) <= now):
                del self._until[next(iter(self._until))]
            return True


class Replays(Protocol):
    """What `verify_signature` notes received requests in (`ReplayCache`, or the receiver's own store)."""

    def first_time(self, key: str, until: float) -> bool:
        """Note request `key` until `until` (unix seconds); False when it was noted already."""
        ...  # pragma: no cover


def verify_signature(
    secret: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    tolerance: timedelta = timedelta(minutes=5),
    now: datetime | None = None,
    replays: Replays | None = None,
) -> None:
    """Check a received webhook: a `webhook-signature` made with one of `secret` (space-separated
    secrets, or several, as in OPENHUB_WEBHOOK_SECRET) over the exact `body` bytes, with the
    `webhook-id` and a `webhook-timestamp` within `tolerance` of `now` (default: this host's clock);
    with `replays` (a `ReplayCache` kept for the receiver's life), also that this very request (its
    `webhook-id` and timestamp) was not taken before: a replay inside the tolerance.

    Raises WebhookSignatureError saying what is wrong: a header missing, a timestamp out of
    tolerance (a late replay), no matching signature (a tampered body, a wrong secret), or a replay.
    """
    keys = secret_keys(secret)
    if not keys:
        raise WebhookSignatureError("no secret to verify the webhook with")
    lower = {name.lower(): value for name, value in headers.items()}
    missing = [name for name in (ID, TIMESTAMP, SIGNATURE) if not lower.get(name)]
    if missing:
        raise WebhookSignatureError(f"the webhook is not signed: no {', '.join(missing)} header")
    try:
        timestamp = int(lower[TIMESTAMP])
    except ValueError:
        raise WebhookSignatureError(f"{TIMESTAMP} is not unix seconds: {lower[TIMESTAMP][:40]!r}") from None
    now = now or datetime.now(timezone.utc)
    age = now.timestamp() - timestamp
    if abs(age) > tolerance.total_seconds():
        raise WebhookSignatureError(
            f"the webhook was signed {age:.0f} s {'ago' if age > 0 else 'ahead'}, "
            f"beyond the tolerance of {tolerance.total_seconds():.0f} s"
        )
    expected = [_signature(key, lower[ID], lower[TIMESTAMP], body) for key in keys]  # signed as sent
    given = [part.partition(",")[2] for part in lower[SIGNATURE].split() if part.startswith("v1,")]
    if not any(hmac.compare_digest(e.encode(), g.encode()) for e in expected for g in given):
        raise WebhookSignatureError("no webhook signature matches the body under any of the secrets")
    # Only a verified request is noted: a forger cannot fill the cache, nor pre-empt a genuine id.
    if replays is not None and not replays.first_time(
        f"{lower[ID]}.{timestamp}", timestamp + tolerance.total_seconds()
    ):
        raise WebhookSignatureError(
            f"this webhook ({ID} {lower[ID][:80]!r}, signed at {timestamp}) was received already: a replay"
        )
