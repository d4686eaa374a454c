"""Who is calling: a source system's API key or an operator's token (Bearer).

A source system's key (OPENHUB_API_KEYS) lets it submit messages as itself and read its own
messages; an operator's token opens the operator endpoints and /admin's data as far as its role
allows (`viewer` reads, `operator` acts on messages, routes, the drain and breakers, `admin` also
changes tokens and configuration): the static admin token (OPENHUB_ADMIN_TOKEN) is one `admin`
named "admin", named tokens with a role each are kept hashed in the store (`openhub.store.tokens`), and an
OpenID Connect provider's JWTs carry their role in a claim (`openhub.api.oidc`);
the metrics token (OPENHUB_METRICS_TOKEN) opens /metrics only, so Prometheus holds no more than that.
Secrets are compared with `hmac.compare_digest` and never logged: a refusal names the reason,
never the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import Counter

from openhub.api.problems import ApiError
from openhub.store import audit, tokens

AUTH_FAILURES = Counter(
    "openhub_auth_failures",
    "Requests refused for their credentials: refused (401), "
    "limited (429: too many refused from the address, or of the secret).",
    ["outcome"],
)
for _outcome in ("refused", "limited"):  # exported at 0 from the start (in multiprocess mode too), so the
    AUTH_FAILURES.labels(outcome=_outcome)  # alert's rate() has a series before the first failure


class FailureLimit:
    """Refused credentials counted per subject, a client address or a presented secret's digest: after
    `failures` within `window` seconds the subject gets 429 (Retry-After: until its oldest counted
    failure leaves the window). In memory, per ingress process: it slows guessing down and says who is
    failing; a proxy or WAF in front is still the place to block.

    Only refused credentials are ever counted or limited: a valid key or the admin token is matched
    first and let in whatever failed from its address (behind a proxy every caller may share one), so
    wrong keys cannot lock a source system or the operators out. At most `capacity` subjects are
    tracked: past it the least recently failing one is forgotten (never every one at once, which a
    flood of addresses could otherwise trigger to reset everyone's count), and a subject whose last
    failure left the window is dropped when met.
    """

    def __init__(
        self, failures: int, window: float, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures, self.window, self.capacity, self.clock = max(1, failures), window, capacity, clock
        # subject -> times of its last `failures` refusals, least recently failing first
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, *subjects: str) -> int | None:
        """Seconds until every one of the subjects may try again (None: they may now)."""
        now = self.clock()
        waits = []
        with self._lock:
            for subject in subjects:
                seen = self._seen.get(subject)
                if seen is None:
                    continue
                if seen[-1] <= now - self.window:  # nothing of it within the window: forgotten
                    del self._seen[subject]
                elif len(seen) >= self.failures and seen[0] > now - self.window:
                    waits.append(max(1, math.ceil(seen[0] + self.window - now)))
        return max(waits) if waits else None

    def failed(self, *subjects: str) -> None:
        """Note one refused request of each subject."""
        now = self.clock()
        with self._lock:
            for subject in subjects:
                seen = self._seen.get(subject)
                if seen is None:
                    seen = self._seen[subject] = deque(maxlen=self.failures)
                else:
                    self._seen.move_to_end(subject)
                seen.append(now)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


bearer = HTTPBearer(auto_error=False, description="A source system's API key, or the admin token.")


@dataclass(frozen=True)
class Credentials:
    """The secrets the ingress accepts."""

    api_keys: dict[str, str] = field(default_factory=dict, repr=False)  # source system -> key
    admin_token: str | None = field(default=None, repr=False)
    # More (system, key) pairs: a system's old and new key during a rotation.
    rotated: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    metrics_token: str | None = field(default=None, repr=False)
    digests: tuple[tuple[str, bytes], ...] = field(init=False, repr=False, compare=False)  # (system, SHA-256)
    admin_digest: bytes | None = field(init=False, repr=False, compare=False)
    metrics_digest: bytes | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Requests are matched against SHA-256 digests only; a `sha256:<hex>` value is a key given by its digest.
        pairs = list(self.api_keys.items()) + [p for p in self.rotated if p not in self.api_keys.items()]
        object.__setattr__(self, "digests", tuple((system, _digest(key)) for system, key in pairs if key))
        object.__setattr__(self, "admin_digest", _digest(self.admin_token) if self.admin_token else None)
        object.__setattr__(self, "metrics_digest", _digest(self.metrics_token) if self.metrics_token else None)

    @classmethod
    def from_settings(cls, settings: Any) -> "Credentials":
        """The secrets OPENHUB_API_KEYS (every key of a system named twice), OPENHUB_ADMIN_TOKEN and
        OPENHUB_METRICS_TOKEN name."""
        return cls(dict(settings.api_keys), settings.admin_token, tuple(settings.api_key_pairs), settings.metrics_token)

    @classmethod
    def for_development(cls) -> "Credentials":
        """Fresh random secrets for `openhub dev`: a key for the example source system CRM and an admin token."""
        return cls({"CRM": "dev-" + secrets.token_urlsafe(18)}, "admin-" + secrets.token_urlsafe(18))


MIN_SECRET_CHARS = 32
PLACEHOLDER = "change-me"  # what deploy/.env.example and deploy/k8s/secrets.env.example hold


def weaknesses(credentials: Credentials, database_url: str = "") -> list[str]:
    """Why these secrets must not guard a deployed hub (empty: they may). Never quotes a secret.

    Refused: the example files' placeholders, secrets shorter than MIN_SECRET_CHARS characters,
    and one secret given to two holders (two systems, or a system and the operators), which would
    let one pass for the other.
    """
    from sqlalchemy.engine import make_url

    problems = []
    pairs = list(credentials.api_keys.items()) + [
        p for p in credentials.rotated if p not in credentials.api_keys.items()
    ]
    named = [(f"OPENHUB_API_KEYS key of {system}", key) for system, key in pairs]
    if credentials.admin_token:
        named.append(("OPENHUB_ADMIN_TOKEN", credentials.admin_token))
    if credentials.metrics_token:
        named.append(("OPENHUB_METRICS_TOKEN", credentials.metrics_token))
    holders: dict[str, list[str]] = {}
    for name, secret in named:
        holders.setdefault(secret, []).append(name)
        if PLACEHOLDER in secret.lower():
            problems.append(f"{name} is the example placeholder ({PLACEHOLDER}…)")
        elif len(secret) < MIN_SECRET_CHARS:
            problems.append(f"{name} is shorter than {MIN_SECRET_CHARS} characters")
    problems += [f"{' and '.join(names)} are the same secret" for names in holders.values() if len(names) > 1]
    try:
        password = make_url(database_url).password if database_url else None
    except Exception:
        password = None
    if password and PLACEHOLDER in str(password).lower():
        problems.append(f"the password in OPENHUB_DATABASE_URL is the example placeholder ({PLACEHOLDER}…)")
    return problems


@dataclass(frozen=True)
class Caller:
    """The authenticated caller: a source system, or an operator (`admin`: any operator token, which reads
    every message) with its token's `name` and `role`."""

    source_system: str | None = None
    admin: bool = False
    role: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.admin and self.role is None:  # the static admin token
            object.__setattr__(self, "role", "admin")
            object.__setattr__(self, "name", self.name or "admin")

    def may(self, role: str) -> bool:
        """Whether the caller's role is `role` or one above it."""
        return self.role is not None and audit.ROLES.index(self.role) >= audit.ROLES.index(role)


def _digest(secret: str) -> bytes:
    if secret.startswith("sha256:") and len(secret) == 71:
        try:
            return bytes.fromhex(secret[7:])
        except ValueError:
            pass  # not hex: an ordinary key that happens to start so
    return hashlib.sha256(secret.encode()).digest()


def _match(secret: str, credentials: Credentials) -> Caller | None:
    given = hashlib.sha256(secret.encode()).digest()
    found: Caller | None = None
    # Compare against every digest so the time taken does not tell which one nearly matched.
    if credentials.admin_digest is not None and hmac.compare_digest(given, credentials.admin_digest):
        found = Caller(admin=True)
    for system, digest in credentials.digests:
        if hmac.compare_digest(given, digest) and found is None:
            found = Caller(source_system=system)
    return found


def _basic(request: Request) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic` header; None without one (or a malformed one)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, ValueError):
        return None
    return (user, password) if colon else None


async def authenticate(request: Request, basic: bool = False) -> Caller:
    """The caller behind the request's Bearer token (with `basic`, also HTTP Basic: the source system's name
    and its key, as SOAP clients send them); 401 without a valid one, 429 when the refused
    credentials of its address or of the very secret it presents passed OPENHUB_AUTH_FAILURES within
    OPENHUB_AUTH_WINDOW. The secret is matched first: a valid one is never limited."""
    creds: HTTPAuthorizationCredentials | None = await bearer(request)
    pair = _basic(request) if basic and creds is None else None
    if pair is not None:
        creds = HTTPAuthorizationCredentials(scheme="Basic", credentials=pair[1])
    challenge = {"WWW-Authenticate": 'Bearer, Basic realm="openhub"' if basic else "Bearer"}
    if creds is None or not creds.credentials:  # no guess: not counted (a page before its token is pasted)
        raise ApiError(
            401,
            "missing credentials: send Authorization: Bearer <API key or admin token>"
            + (" or Basic <source system>:<API key>" if basic else ""),
            challenge,
        )
    caller = _match(creds.credentials, request.app.state.credentials)
    if caller is not None and pair is not None and caller.source_system != pair[0]:
        caller = None  # a key presented under another system's name is refused like a wrong key
    if caller is None:
        found = await run_in_threadpool(
            tokens.lookup, creds.credentials, url=request.app.state.hub.settings.database_url
        )
        oidc = getattr(request.app.state, "oidc", None)
        if found is None and oidc is not None:  # an operator signed in at the OpenID Connect provider
            found = await run_in_threadpool(oidc.identify, creds.credentials)
        if found is not None:
            caller = Caller(admin=True, name=found[0], role=found[1])
    if caller is not None:
        request.state.caller = caller
        _act_as(request, caller)
        return caller
    limit: FailureLimit | None = getattr(request.app.state, "auth_failures", None)
    # The address is the client's as the trusted proxies (OPENHUB_TRUSTED_PROXIES) forward it; the secret is
    # counted by its digest, so one wrong key is limited wherever it comes from and is never kept itself.
    address = request.client.host if request.client else "?"
    subjects = (f"address {address}", "secret " + hashlib.sha256(creds.credentials.encode()).hexdigest())
    wait = limit.retry_after(*subjects) if limit is not None else None
    if wait is not None:
        AUTH_FAILURES.labels(outcome="limited").inc()
        raise ApiError(
            429,
            f"too many refused credentials from {address} or with this secret; retry in {wait} s",
            {"Retry-After": str(wait)},
        )
    AUTH_FAILURES.labels(outcome="refused").inc()
    if limit is not None:
        limit.failed(*subjects)
    raise ApiError(401, "invalid API key or admin token", challenge)


def _act_as(request: Request, caller: Caller) -> None:
    """What the request does is audited as the caller's (openhub.store.audit), with its address and request id."""
    request_id = request.headers.get("x-request-id", "")[:100]
    if not request_id or not request_id.isprintable():
        request_id = secrets.token_hex(8)
    request.state.request_id = request_id
    name = caller.name if caller.role is not None else f"system:{caller.source_system}"
    audit.set_actor(
        audit.Actor(name or "?", caller.role or "source", request.client.host if request.client else None, request_id)
    )


async def source_system(request: Request) -> str:
    """Dependency of the submit endpoints: the source system whose key was presented."""
    return await submitter(request)


async def submitter(request: Request, basic: bool = False) -> str:
    """The source system whose key was presented (with `basic`, as the SOAP ingress asks, also by HTTP
    Basic); 403 for the admin token."""
    caller = await authenticate(request, basic)
    if caller.source_system is None:
        raise ApiError(403, "messages are submitted with a source system's API key, not the admin token")
    return caller.source_system


def requires(role: str) -> Callable[[Request], Any]:
    """The dependency of an operator endpoint: a token of `role` or above; 403 for a lower role or a source
    system's key. Every operator endpoint has one (tests/integration/api/test_roles_api.py checks the
    OpenAPI document's mutating endpoints against it)."""

    async def needs_role(request: Request) -> Caller:
        caller = await authenticate(request)
        if not caller.may(role):
            if caller.role is None:
                raise ApiError(
                    403,
                    f"this endpoint needs an operator token with the role {role} or the admin "
                    "token (OPENHUB_ADMIN_TOKEN), not a source system's key",
                )
            raise ApiError(403, f"this endpoint needs the role {role}; the token {caller.name!r} is a {caller.role}")
        return caller

    needs_role.__name__ = f"needs_{role}"
    return needs_role


viewer = requires("viewer")
"""Reads of the operators (messages of every system, routes, overview, workers, confirmations, audit)."""
operator = requires("operator")
"""Actions on messages, routes, the drain, confirmations and breakers."""
admin = requires("admin")
"""Tokens and configuration."""


async def reader(request: Request) -> Caller:
    """Dependency of the read endpoints: the admin token, or a source system reading its own messages."""
    return await authenticate(request)


async def scraper(request: Request) -> None:
    """Dependency of /metrics: the metrics token (OPENHUB_METRICS_TOKEN) or the admin token.

    The series name every route, step and source system: not for anyone who can reach the port,
    nor for a source system's key (403).
    """
    digest = request.app.state.credentials.metrics_digest
    creds: HTTPAuthorizationCredentials | None = await bearer(request)
    if (
        digest is not None
        and creds is not None
        and creds.credentials
        and hmac.compare_digest(hashlib.sha256(creds.credentials.encode()).digest(), digest)
    ):
        return
    caller = await authenticate(request)
    if not caller.admin:
        raise ApiError(403, "/metrics needs the metrics token (OPENHUB_METRICS_TOKEN) or an operator token")
