"""Settings: every value has an OPENHUB_* environment override (listed in README.md, "Running it for real").

`celeryconfig.py` maps these onto Celery's own settings; the library reads them from here so
that a producer process (a web app calling `openhub.submit`) needs no Celery configuration.
Durations are seconds in the environment and `timedelta` in code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Mapping

from openhub.core import secret_shapes
from openhub.core.endpoints import ConfirmEndpoint, parse_endpoints
from openhub.core.errors import ConfigurationError
from openhub.core.signing import secret_keys


def _env(env: Mapping[str, str], name: str, default: str) -> str:
    return env.get(name, default)


def _seconds(env: Mapping[str, str], name: str, default: float) -> timedelta:
    raw = env.get(name)
    if raw is None or raw == "":
        return timedelta(seconds=default)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ConfigurationError(f"{name} must not be negative, got {raw!r}")
    return timedelta(seconds=value)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from None


def _limits(env: Mapping[str, str], name: str, what: str = "calls in flight") -> dict[str, int]:
    """Parse `billing=4,crm=2` into {"billing": 4, "crm": 2} (each at least 1 of `what`)."""
    limits = {}
    for system, raw in _pairs(env, name).items():
        try:
            limits[system] = int(raw)
        except ValueError:
            raise ConfigurationError(f"{name}: {system}={raw!r} is not a whole number of {what}") from None
        if limits[system] < 1:
            raise ConfigurationError(f"{name}: {system} must allow at least 1 of {what}")
    return limits


def _rates(env: Mapping[str, str], name: str) -> dict[str, tuple[int, float]]:
    """Parse `billing=10/1,crm=100/60` (calls per seconds) into {"billing": (10, 1.0), "crm": (100, 60.0)}."""
    rates = {}
    for system, raw in _pairs(env, name).items():
        calls, _, seconds = raw.partition("/")
        try:
            rates[system] = (int(calls), float(seconds))
        except ValueError:
            raise ConfigurationError(f"{name}: {system}={raw!r} is not CALLS/SECONDS") from None
        if rates[system][0] < 1 or not rates[system][1] > 0:
            raise ConfigurationError(f"{name}: {system} needs at least 1 call per a positive number of seconds")
    return rates


def _all_pairs(env: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    """Parse `A=x,A=y,B=z` into every (name, value), a name given twice keeping both."""
    raw = env.get(name, "").strip()
    pairs = []
    for part in raw.split(",") if raw else []:
        if "=" not in part:
            raise ConfigurationError(f"{name}: expected NAME=value pairs separated by commas, got {part!r}")
        key, value = part.split("=", 1)
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def _pairs(env: Mapping[str, str], name: str) -> dict[str, str]:
    """Parse `A=x,B=y` into {"A": "x", "B": "y"}."""
    raw = env.get(name, "").strip()
    result: dict[str, str] = {}
    if not raw:
        return result
    for part in raw.split(","):
        if "=" not in part:
            raise ConfigurationError(f"{name}: expected NAME=value pairs separated by commas, got {part!r}")
        key, value = part.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def _names(env: Mapping[str, str], name: str) -> frozenset[str]:
    """Comma-separated names, lower case."""
    return frozenset(n.strip().lower() for n in _env(env, name, "").split(",") if n.strip())


def _redact_bodies(env: Mapping[str, str]) -> str:
    # Checked at load: a typo here must not silently record bodies in clear (or drop them).
    mode = _env(env, "OPENHUB_REDACT_BODIES", "fields").strip().lower() or "fields"
    if mode not in ("fields", "all", "none"):
        raise ConfigurationError(f"OPENHUB_REDACT_BODIES must be fields, all or none, got {mode!r}")
    return mode


def _confirm_secrets(env: Mapping[str, str], operators: tuple[bytes, ...]) -> dict[str, tuple[bytes, ...]]:
    """OPENHUB_CONFIRM_SECRETS `CRM=whsec_…,SHOP=whsec_…` (a system named twice keeps both while its secret
    rotates). One secret given to two systems, or a system's that is the operators' (OPENHUB_WEBHOOK_SECRET),
    would let its holder forge the other's notifications: refused."""
    name = "OPENHUB_CONFIRM_SECRETS"
    keys: dict[str, tuple[bytes, ...]] = {}
    holders: dict[bytes, str] = {key: "OPENHUB_WEBHOOK_SECRET" for key in operators}
    for system, secret in _all_pairs(env, name):
        for key in secret_keys(secret, f"{name} secret of {system}", strong=True):
            if holders.setdefault(key, system) != system:
                raise ConfigurationError(f"{name}: {holders[key]} and {system} have the same secret")
            keys[system] = (*keys.get(system, ()), key)
    return keys


def _confirm_endpoints(
    env: Mapping[str, str], secrets: dict[str, tuple[bytes, ...]], timeout: timedelta
) -> dict[str, ConfirmEndpoint]:
    """OPENHUB_CONFIRM_ENDPOINTS (openhub.core.endpoints): each system's must have its OPENHUB_CONFIRM_SECRETS entry,
    so every stock confirmation is signed, and a timeout within OPENHUB_CONFIRM_TIMEOUT (the sending lease's)."""
    endpoints = parse_endpoints(_env(env, "OPENHUB_CONFIRM_ENDPOINTS", ""))
    for system, endpoint in endpoints.items():
        if not secrets.get(system):
            raise ConfigurationError(
                f"OPENHUB_CONFIRM_ENDPOINTS names {system}, which has no OPENHUB_CONFIRM_SECRETS "
                "secret: the stock confirmations are always signed"
            )
        if endpoint.timeout is not None and endpoint.timeout > timeout:
            raise ConfigurationError(
                f"OPENHUB_CONFIRM_ENDPOINTS: {system}'s timeout is longer than "
                "OPENHUB_CONFIRM_TIMEOUT, the deadline of every confirmation"
            )
    return endpoints


def _priority(env: Mapping[str, str], name: str, default: int) -> int:
    value = _int(env, name, default)
    if not 0 <= value <= 9:
        raise ConfigurationError(f"{name} must be a priority 0..9 (higher = sooner), got {value}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _env(env, name, default).strip().lower() or default
    if value != default and value not in choices:
        raise ConfigurationError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """The hub's settings, read once from the environment."""

    var_dir: Path
    database_url: str
    broker_url: str
    routes: tuple[str, ...]
    max_fails: int
    retry_interval: timedelta
    postpone_interval: timedelta
    poll_interval: timedelta
    lease_grace: timedelta
    step_timeout: timedelta
    confirm_max_fails: int
    confirm_interval: timedelta
    # The overall deadline of one webhook POST (openhub.outbound.notify.post_within), whatever the receiver does.
    confirm_timeout: timedelta = timedelta(seconds=30)
    # How long the HTTP caller of a synchronous route (Route(sync=True)) waits for its result when it does not
    # ask (`Prefer: wait=N`), and the most it may ask for; past it the answer is 202 and the message goes on.
    sync_wait: timedelta = timedelta(seconds=10)
    sync_max_wait: timedelta = timedelta(seconds=30)
    # The queue of the openhub.confirm task, which sends confirmations and hooks' notifications: a queue of
    # its own, served by its own workers, so a slow receiver never holds a step's worker process.
    confirm_queue: str = "openhub.confirm"
    api_keys: dict[str, str] = field(default_factory=dict)
    auth_failures: int = 20  # wrong keys from one address within auth_window before it gets 429
    auth_window: timedelta = timedelta(seconds=60)
    # Proxies whose X-Forwarded-For/-Proto the ingress believes (addresses or networks, comma-separated;
    # uvicorn's forwarded_allow_ips). Empty: uvicorn's own default, 127.0.0.1 or FORWARDED_ALLOW_IPS.
    trusted_proxies: str = ""
    # Every (system, key) of OPENHUB_API_KEYS, a system named twice keeping both (a key rotation).
    api_key_pairs: tuple[tuple[str, str], ...] = ()
    admin_token: str | None = None
    metrics_token: str | None = None  # Prometheus's bearer token for /metrics (the admin token opens it too)
    # Operators signed in through an OpenID Connect provider (openhub.api.oidc): its issuer, the audience its
    # tokens must name, where its keys are (empty: the issuer's discovery document says), the claim that
    # holds an operator's roles, and claim value -> role (empty: the role names themselves).
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_role_claim: str = "roles"
    oidc_roles: dict[str, str] = field(default_factory=dict)
    max_payload_bytes: int = 1_048_576
    throttling: str = ""
    redis_url: str | None = None
    # A worker process whose heartbeat is older than this (while others' go on) is dead: its steps are
    # repaired at once instead of at the end of their lease. It heartbeats every fifth of it.
    worker_dead_after: timedelta = timedelta(seconds=15)
    # Runs of a message's step lost in a row (their worker died with them) before it is FAILED: a step
    # that takes its worker down every time (a poison message) must not loop for ever; losses are not failures.
    max_lost_runs: int = 5
    max_clock_skew: timedelta = timedelta(seconds=300)
    # HOST:PORT of a worker's own /metrics (tasks/store_gate.py; ":9808" on every address); empty: not served
    worker_metrics: str = ""
    max_nesting: int = 64
    max_concurrency: int = 256
    metrics_cache: timedelta = timedelta(seconds=5)
    http_record_bytes: int = 4096
    http_record_days: int = 14
    # Header names redacted in recorded exchanges on top of openhub.core.redact's built-in ones (lower case).
    redact_headers: frozenset[str] = frozenset()
    # Names of headers, query parameters and fields whose values every text the hub keeps or exports has
    # redacted, on top of openhub.core.redact's built-in ones (OPENHUB_REDACT_NAMES and OPENHUB_REDACT_HEADERS).
    redact_names: frozenset[str] = frozenset()
    redact_bodies: str = "fields"  # fields | all | none: see openhub.core.redact.redact_body
    breaker_failures: int = 5
    system_limits: dict[str, int] = field(default_factory=dict)  # system -> calls in flight at most
    # Source system -> its messages not yet final at most (OPENHUB_BACKLOG_LIMITS); past it submissions are refused.
    backlog_limits: dict[str, int] = field(default_factory=dict)
    system_rates: dict[str, tuple[int, float]] = field(default_factory=dict)  # system -> (calls, per seconds)
    webhook_url: str | None = None
    webhook_states: frozenset[str] = frozenset({"FAILED"})
    # The HMAC keys the operators' state hooks (the stock webhook) sign with (OPENHUB_WEBHOOK_SECRET; none:
    # unsigned); kept out of repr. Never a confirmation's: a source system holding it could forge the rest.
    webhook_secrets: tuple[bytes, ...] = field(default=(), repr=False)
    # Per source system, the HMAC keys its confirmations are signed with (OPENHUB_CONFIRM_SECRETS).
    confirm_secrets: dict[str, tuple[bytes, ...]] = field(default_factory=dict, repr=False)
    # Per source system, its endpoint of the stock confirmation protocol (OPENHUB_CONFIRM_ENDPOINTS); kept
    # out of repr: its headers may hold credentials.
    confirm_endpoints: dict[str, ConfirmEndpoint] = field(default_factory=dict, repr=False)
    breaker_open: timedelta = timedelta(seconds=60)
    # A link to a message's trace (Jaeger, Grafana Tempo...): a URL template with {trace_id} (None: no link).
    trace_url: str | None = None
    log_format: str = "text"  # text | json: how the hub's processes write their log lines (openhub.core.logs)
    # The level of the "openhub" loggers (OPENHUB_LOG_LEVEL: debug, info, warning, error, critical; empty:
    # theirs is the root logger's), changeable at run time (openhub.core.live).
    log_level: str = ""
    # RabbitMQ closes the channel of a consumer holding a delivery unacknowledged longer than its
    # `consumer_timeout` (rabbitmq.conf; 30 min by default on 3.10, which has no per-queue setting): the
    # value the broker has, so that a worker whose routes' steps may run longer refuses to start.
    consumer_timeout: timedelta = timedelta(seconds=1800)
    # Priority of a message whose route and submit name none (0-9, higher = sooner, JMS's default).
    default_priority: int = 4
    # The store's live values these settings carry (openhub.core.live: NAME -> text, sorted), and the settings
    # they were applied to, the driver's own; () and None for settings read from the environment only.
    live_overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    before_overrides: "Settings | None" = field(default=None, repr=False, compare=False)

    @property
    def broker(self) -> str:
        """Which broker the URL names: "amqp" (RabbitMQ), "redis" or "filesystem" (the embedded one)."""
        scheme = self.broker_url.split("://", 1)[0].lower()
        if scheme in ("amqp", "amqps", "pyamqp"):
            return "amqp"
        return "redis" if scheme.startswith("redis") else scheme

    @property
    def embedded(self) -> bool:
        """True on the embedded default (SQLite and the filesystem transport)."""
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Read every OPENHUB_* variable of `env` (default: this process's environment), falling back
        to the embedded defaults under ./var/."""
        env = os.environ if env is None else env
        var_dir = Path(_env(env, "OPENHUB_VAR_DIR", "var")).absolute()
        routes = tuple(r.strip() for r in _env(env, "OPENHUB_ROUTES", "routes").split(",") if r.strip())
        broker = _env(env, "OPENHUB_BROKER_URL", "filesystem://")
        return cls(
            var_dir=var_dir,
            database_url=_env(env, "OPENHUB_DATABASE_URL", f"sqlite:///{var_dir / 'openhub.db'}"),
            broker_url=broker,
            routes=routes,
            max_fails=_int(env, "OPENHUB_MAX_FAILS", 3),
            retry_interval=_seconds(env, "OPENHUB_RETRY_INTERVAL", 60),
            postpone_interval=_seconds(env, "OPENHUB_POSTPONE_INTERVAL", 5),
            poll_interval=_seconds(env, "OPENHUB_POLL_INTERVAL", 5),
            lease_grace=_seconds(env, "OPENHUB_LEASE_GRACE", 300),
            step_timeout=_seconds(env, "OPENHUB_STEP_TIMEOUT", 300),
            confirm_max_fails=_int(env, "OPENHUB_CONFIRM_MAX_FAILS", 3),
            confirm_interval=_seconds(env, "OPENHUB_CONFIRM_INTERVAL", 60),
            confirm_timeout=_seconds(env, "OPENHUB_CONFIRM_TIMEOUT", 30),
            sync_wait=_seconds(env, "OPENHUB_SYNC_WAIT", 10),
            sync_max_wait=_seconds(env, "OPENHUB_SYNC_MAX_WAIT", 30),
            confirm_queue=_env(env, "OPENHUB_CONFIRM_QUEUE", "openhub.confirm").strip(),
            api_keys=_pairs(env, "OPENHUB_API_KEYS"),
            api_key_pairs=_all_pairs(env, "OPENHUB_API_KEYS"),
            auth_failures=_int(env, "OPENHUB_AUTH_FAILURES", 20),
            auth_window=_seconds(env, "OPENHUB_AUTH_WINDOW", 60),
            trusted_proxies=",".join(
                p.strip() for p in _env(env, "OPENHUB_TRUSTED_PROXIES", "").split(",") if p.strip()
            ),
            admin_token=env.get("OPENHUB_ADMIN_TOKEN") or None,
            metrics_token=env.get("OPENHUB_METRICS_TOKEN") or None,
            oidc_issuer=env.get("OPENHUB_OIDC_ISSUER") or None,
            oidc_audience=env.get("OPENHUB_OIDC_AUDIENCE") or None,
            oidc_jwks_url=env.get("OPENHUB_OIDC_JWKS_URL") or None,
            oidc_role_claim=_env(env, "OPENHUB_OIDC_ROLE_CLAIM", "roles").strip() or "roles",
            oidc_roles=_pairs(env, "OPENHUB_OIDC_ROLES"),
            max_payload_bytes=_int(env, "OPENHUB_MAX_PAYLOAD_BYTES", 1_048_576),
            throttling=_env(env, "OPENHUB_THROTTLING", ""),
            redis_url=env.get("OPENHUB_REDIS_URL") or (broker if broker.startswith("redis") else None),
            worker_dead_after=_seconds(env, "OPENHUB_WORKER_DEAD_AFTER", 15),
            max_lost_runs=_int(env, "OPENHUB_MAX_LOST_RUNS", 5),
            max_clock_skew=_seconds(env, "OPENHUB_MAX_CLOCK_SKEW", 300),
            worker_metrics=_env(env, "OPENHUB_WORKER_METRICS", ""),
            max_nesting=_int(env, "OPENHUB_MAX_NESTING", 64),
            max_concurrency=_int(env, "OPENHUB_MAX_CONCURRENCY", 256),
            metrics_cache=_seconds(env, "OPENHUB_METRICS_CACHE", 5),
            http_record_bytes=_int(env, "OPENHUB_HTTP_RECORD_BYTES", 4096),
            http_record_days=_int(env, "OPENHUB_HTTP_RECORD_DAYS", 14),
            redact_headers=(headers := _names(env, "OPENHUB_REDACT_HEADERS")),
            redact_names=headers | _names(env, "OPENHUB_REDACT_NAMES"),
            redact_bodies=_redact_bodies(env),
            breaker_failures=_int(env, "OPENHUB_BREAKER_FAILURES", 5),
            breaker_open=_seconds(env, "OPENHUB_BREAKER_OPEN", 60),
            system_limits=_limits(env, "OPENHUB_SYSTEM_LIMITS"),
            backlog_limits=_limits(env, "OPENHUB_BACKLOG_LIMITS", "messages not yet final"),
            system_rates=_rates(env, "OPENHUB_SYSTEM_RATES"),
            webhook_url=env.get("OPENHUB_WEBHOOK_URL") or None,
            webhook_states=frozenset(
                s.strip().upper() for s in _env(env, "OPENHUB_WEBHOOK_STATES", "FAILED").split(",") if s.strip()
            ),
            webhook_secrets=(
                operators := secret_keys(_env(env, "OPENHUB_WEBHOOK_SECRET", ""), "OPENHUB_WEBHOOK_SECRET", strong=True)
            ),
            confirm_secrets=(confirm_secrets := _confirm_secrets(env, operators)),
            confirm_endpoints=_confirm_endpoints(env, confirm_secrets, _seconds(env, "OPENHUB_CONFIRM_TIMEOUT", 30)),
            trace_url=env.get("OPENHUB_TRACE_URL") or None,
            log_format=_choice(env, "OPENHUB_LOG_FORMAT", "text", ("text", "json")),
            log_level=_choice(env, "OPENHUB_LOG_LEVEL", "", ("debug", "info", "warning", "error", "critical")),
            consumer_timeout=_seconds(env, "OPENHUB_CONSUMER_TIMEOUT", 1800),
            default_priority=_priority(env, "OPENHUB_DEFAULT_PRIORITY", 4),
        )


_settings: Settings | None = None  # read from the environment on first use
_served: Settings | None = None  # the settings of the hub installed in this process (openhub.engine.hub.install)


def get_settings() -> Settings:
    """The settings of the hub installed in this process (`openhub.engine.hub.install`), else the process's
    own, read from the OPENHUB_* environment on first use."""
    global _settings
    if _served is not None:
        return _served
    if _settings is None:
        _settings = Settings.from_env()
        _redact_as(_settings)
    return _settings


def serve_settings(settings: Settings | None) -> None:
    """Answer `settings` from `get_settings()` until told otherwise (None: the environment's again);
    `openhub.engine.hub.install` calls it."""
    global _served
    _served = settings
    _redact_as(settings if settings is not None else _settings)


def swap_settings(old: Settings, new: Settings) -> None:
    """Answer `new` from `get_settings()` wherever it answered `old` (a hub's live settings changed:
    openhub.engine.hub.Hub.refresh); settings it did not answer are left alone."""
    global _settings, _served
    if _served is old:
        _served = new
    if _settings is old:
        _settings = new
    if new is (_served if _served is not None else _settings):
        _redact_as(new)


def _redact_as(settings: Settings | None) -> None:
    """The process's log lines and records are redacted by the names of the process's settings (whichever
    they are now: read from the environment, the installed hub's, changed live): handed to
    openhub.core.secret_shapes here, where they change, so that no module below reads them from here."""
    secret_shapes.configure(settings.redact_names if settings is not None else frozenset())


def reset_settings() -> None:
    """Forget cached settings so the next get_settings() reads the environment again (tests, CLI)."""
    global _settings
    _settings = None
