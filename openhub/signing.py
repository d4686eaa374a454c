"""Standard Webhooks signatures (https://www.standardwebhooks.com/): how the stock webhook signs what
it POSTs, and how a receiver checks it.

A POST carries `webhook-id` (its Idempotency-Key, the same on every retry of one notification),
`webhook-timestamp` (unix seconds when it was sent) and `webhook-signature`: one `v1,<base64>` per
secret, space-separated, each the HMAC-SHA256 under that secret of `{id}.{timestamp}.{body}` over
the exact bytes of the body. Two secrets during a rotation give two signatures; either verifies.

A secret is given in the Standard Webhooks form `whsec_<base64>` (the key is the decoded bytes) or
as a plain string (the key is its UTF-8 bytes). This module loads no HTTP library: settings use it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone

from .errors import ConfigurationError, WebhookSignatureError

PREFIX = "whsec_"
ID, TIMESTAMP, SIGNATURE = "webhook-id", "webhook-timestamp", "webhook-signature"


def secret_keys(secrets: str | Iterable[str], name: str = "the webhook secret") -> tuple[bytes, ...]:
    """The HMAC keys of `secrets` (a string of space-separated secrets, or several strings).

    A malformed `whsec_` secret is a ConfigurationError naming `name`, never the secret itself."""
    given = secrets.split() if isinstance(secrets, str) else [s for raw in secrets for s in raw.split()]
    keys = []
    for position, secret in enumerate(given, 1):
        if secret.startswith(PREFIX):
            encoded = secret[len(PREFIX):]
            try:  # padding forgiven, as the reference libraries do: some issuers drop it
                key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise ConfigurationError(f"{name}: secret {position} starts with {PREFIX} but the rest is not "
                                         f"base64") from None
        else:
            key = secret.encode()
        if not key:
            raise ConfigurationError(f"{name}: secret {position} is empty")
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


def verify_signature(secret: str | Iterable[str], headers: Mapping[str, str], body: bytes,
                     tolerance: timedelta = timedelta(minutes=5), now: datetime | None = None) -> None:
    """Check a received webhook: a `webhook-signature` made with one of `secret` (space-separated
    secrets, or several, as in OPENHUB_WEBHOOK_SECRET) over the exact `body` bytes, with the
    `webhook-id` and a `webhook-timestamp` within `tolerance` of `now` (default: this host's clock).

    Raises WebhookSignatureError saying what is wrong: a header missing, a timestamp out of
    tolerance (a replay), or no matching signature (a tampered body, a wrong secret).
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
        raise WebhookSignatureError(f"the webhook was signed {age:.0f} s {'ago' if age > 0 else 'ahead'}, "
                                    f"beyond the tolerance of {tolerance.total_seconds():.0f} s")
    expected = [_signature(key, lower[ID], lower[TIMESTAMP], body) for key in keys]  # signed as sent
    given = [part.partition(",")[2] for part in lower[SIGNATURE].split() if part.startswith("v1,")]
    if not any(hmac.compare_digest(e.encode(), g.encode()) for e in expected for g in given):
        raise WebhookSignatureError("no webhook signature matches the body under any of the secrets")
