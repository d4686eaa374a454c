"""Live configuration: which settings may change while the hub runs, how a stored value is checked and
applied, and how the settings in force are shown with where each came from.

A value an admin sets (`openhub config set`, `PUT /api/v1/config/{name}`) is kept in the store
(openhub.store.live) and parsed exactly as `Settings.from_env` parses the environment's; every process
applies the store's values on top of the settings its driver built (`Hub.refresh`, within one poll interval).
Only the settings read at each use are live (LIVE): the database, the broker, the routes, secrets, timeouts
and leases are read once at start-up, or are held by other processes' clocks, and need a restart.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from openhub.core.config import Settings
from openhub.core.errors import ConfigurationError
from openhub.core.redact import redact_text, redact_url
from openhub.core.registry import WEBHOOK, Registry, on_state

# Every setting by its environment variable, with the Settings fields it sets.
SETTINGS: dict[str, tuple[str, ...]] = {
    "OPENHUB_VAR_DIR": ("var_dir",),
    "OPENHUB_DATABASE_URL": ("database_url",),
    "OPENHUB_BROKER_URL": ("broker_url",),
    "OPENHUB_ROUTES": ("routes",),
    "OPENHUB_MAX_FAILS": ("max_fails",),
    "OPENHUB_RETRY_INTERVAL": ("retry_interval",),
    "OPENHUB_POSTPONE_INTERVAL": ("postpone_interval",),
    "OPENHUB_POLL_INTERVAL": ("poll_interval",),
    "OPENHUB_LEASE_GRACE": ("lease_grace",),
    "OPENHUB_STEP_TIMEOUT": ("step_timeout",),
    "OPENHUB_CONFIRM_MAX_FAILS": ("confirm_max_fails",),
    "OPENHUB_CONFIRM_INTERVAL": ("confirm_interval",),
    "OPENHUB_CONFIRM_TIMEOUT": ("confirm_timeout",),
    "OPENHUB_SYNC_WAIT": ("sync_wait",),
    "OPENHUB_SYNC_MAX_WAIT": ("sync_max_wait",),
    "OPENHUB_CONFIRM_QUEUE": ("confirm_queue",),
    "OPENHUB_API_KEYS": ("api_keys", "api_key_pairs"),
    "OPENHUB_AUTH_FAILURES": ("auth_failures",),
    "OPENHUB_AUTH_WINDOW": ("auth_window",),
    "OPENHUB_TRUSTED_PROXIES": ("trusted_proxies",),
    "OPENHUB_ADMIN_TOKEN": ("admin_token",),
    "OPENHUB_METRICS_TOKEN": ("metrics_token",),
    "OPENHUB_OIDC_ISSUER": ("oidc_issuer",),
    "OPENHUB_OIDC_AUDIENCE": ("oidc_audience",),
    "OPENHUB_OIDC_JWKS_URL": ("oidc_jwks_url",),
    "OPENHUB_OIDC_ROLE_CLAIM": ("oidc_role_claim",),
    "OPENHUB_OIDC_ROLES": ("oidc_roles",),
    "OPENHUB_MAX_PAYLOAD_BYTES": ("max_payload_bytes",),
    "OPENHUB_THROTTLING": ("throttling",),
    "OPENHUB_REDIS_URL": ("redis_url",),
    "OPENHUB_WORKER_DEAD_AFTER": ("worker_dead_after",),
    "OPENHUB_MAX_LOST_RUNS": ("max_lost_runs",),
    "OPENHUB_MAX_CLOCK_SKEW": ("max_clock_skew",),
    "OPENHUB_WORKER_METRICS": ("worker_metrics",),
    "OPENHUB_MAX_NESTING": ("max_nesting",),
    "OPENHUB_MAX_CONCURRENCY": ("max_concurrency",),
    "OPENHUB_METRICS_CACHE": ("metrics_cache",),
    "OPENHUB_HTTP_RECORD_BYTES": ("http_record_bytes",),
    "OPENHUB_HTTP_RECORD_DAYS": ("http_record_days",),
    "OPENHUB_REDACT_HEADERS": ("redact_headers",),
    "OPENHUB_REDACT_NAMES": ("redact_names",),
    "OPENHUB_REDACT_BODIES": ("redact_bodies",),
    "OPENHUB_BREAKER_FAILURES": ("breaker_failures",),
    "OPENHUB_BREAKER_OPEN": ("breaker_open",),
    "OPENHUB_SYSTEM_LIMITS": ("system_limits",),
    "OPENHUB_BACKLOG_LIMITS": ("backlog_limits",),
    "OPENHUB_SYSTEM_RATES": ("system_rates",),
    "OPENHUB_WEBHOOK_URL": ("webhook_url",),
    "OPENHUB_WEBHOOK_STATES": ("webhook_states",),
    "OPENHUB_WEBHOOK_SECRET": ("webhook_secrets",),
    "OPENHUB_CONFIRM_SECRETS": ("confirm_secrets",),
    "OPENHUB_CONFIRM_ENDPOINTS": ("confirm_endpoints",),
    "OPENHUB_TRACE_URL": ("trace_url",),
    "OPENHUB_LOG_FORMAT": ("log_format",),
    "OPENHUB_LOG_LEVEL": ("log_level",),
    "OPENHUB_CONSUMER_TIMEOUT": ("consumer_timeout",),
    "OPENHUB_DEFAULT_PRIORITY": ("default_priority",),
}
# The settings read afresh at each use, so a changed value is the next use's: retry and postpone timing,
# failure counts, system limits and rates, breaker thresholds, the stock webhook's states, the log level.
LIVE = frozenset(
    {
        "OPENHUB_RETRY_INTERVAL",
        "OPENHUB_MAX_FAILS",
        "OPENHUB_POSTPONE_INTERVAL",
        "OPENHUB_SYSTEM_LIMITS",
        "OPENHUB_SYSTEM_RATES",
        "OPENHUB_BREAKER_FAILURES",
        "OPENHUB_BREAKER_OPEN",
        "OPENHUB_CONFIRM_MAX_FAILS",
        "OPENHUB_CONFIRM_INTERVAL",
        "OPENHUB_WEBHOOK_STATES",
        "OPENHUB_LOG_LEVEL",
    }
)
# Shown as set or not, never their value (tokens, keys, secrets; an endpoint's headers may hold credentials).
SECRET = frozenset(
    {
        "OPENHUB_API_KEYS",
        "OPENHUB_ADMIN_TOKEN",
        "OPENHUB_METRICS_TOKEN",
        "OPENHUB_WEBHOOK_SECRET",
        "OPENHUB_CONFIRM_SECRETS",
        "OPENHUB_CONFIRM_ENDPOINTS",
    }
)
MASK = "***"
SOURCES = ("default", "environment", "code", "store")
log = logging.getLogger("openhub.config")


class UnknownSetting(ConfigurationError):
    """No openhub setting has this name."""


class NeedsRestart(ConfigurationError):
    """The setting is read once, at start-up: it cannot change while the hub runs."""


def parse_live(name: str, value: str) -> dict[str, Any]:
    """The Settings fields a live setting's text gives, parsed as `Settings.from_env` parses the environment;
    UnknownSetting, NeedsRestart, or ConfigurationError naming the setting for a bad value."""
    if name not in SETTINGS:
        raise UnknownSetting(f"{name} is not an openhub setting (`openhub config` lists them)")
    if name not in LIVE:
        raise NeedsRestart(
            f"{name} is not safe to change at run time: it is read when a process starts; "
            "set it in the environment and restart the hub's processes"
        )
    if not isinstance(value, str) or not value.isprintable() or len(value) > 2000:
        raise ConfigurationError(f"{name} must be printable text of at most 2000 characters")
    parsed = Settings.from_env({name: value})
    fields = {f: getattr(parsed, f) for f in SETTINGS[name]}
    if name == "OPENHUB_WEBHOOK_STATES":
        try:
            on_state(*sorted(parsed.webhook_states))
        except ConfigurationError:
            raise ConfigurationError(
                f"{name} must name message states other than NEW, comma-separated, got {value!r}"
            ) from None
    return fields


def usable(overrides: Mapping[str, str]) -> dict[str, str]:
    """The store's live values that parse; one that does not (written around the API) is left out and
    logged: the store's row is an admin's to fix, and the processes go on with the rest."""
    kept = {}
    for name, value in overrides.items():
        try:
            parse_live(name, value)
        except ConfigurationError as exc:
            log.warning("live setting left out: %s", exc)
            continue
        kept[name] = value
    return kept


def with_overrides(base: Settings, overrides: Mapping[str, str]) -> Settings:
    """`base` with live values applied (each parsed by `parse_live`; see `usable`)."""
    if not overrides:
        return base
    fields: dict[str, Any] = {}
    for name, value in sorted(overrides.items()):
        fields.update(parse_live(name, value))
    return dataclasses.replace(base, **fields, live_overrides=tuple(sorted(overrides.items())), before_overrides=base)


def driver_settings(settings: Settings) -> Settings:
    """The settings a hub's driver built, before any store's values."""
    return settings.before_overrides or settings


def apply(old: Settings, new: Settings, registry: Registry) -> None:
    """Carry out what a live change needs besides the settings object: the stock webhook's states in the
    registry (its hook was declared with the states of start-up) and the "openhub" loggers' level."""
    hook = registry.hooks.get(WEBHOOK)
    if hook is not None and hook[0] != new.webhook_states:
        registry.hooks[WEBHOOK] = (new.webhook_states, hook[1])
    if old.log_level != new.log_level:
        set_log_level(new.log_level)


_started_level: int | None = None  # the "openhub" logger's level before OPENHUB_LOG_LEVEL first set it


def set_log_level(level: str) -> None:
    """Make `level` (OPENHUB_LOG_LEVEL) the "openhub" loggers'; empty: the level the process started with (its
    driver's: `openhub serve --log-level` sets it, a Celery worker's is its root logger's). Resetting it to
    NOTSET dropped `openhub serve`'s INFO lines, the root logger being at WARNING there."""
    global _started_level
    logger = logging.getLogger("openhub")
    if _started_level is None:
        _started_level = logger.level
    logger.setLevel(level.upper() if level else _started_level)


def shown(value: Any) -> str:
    """A setting's value as its environment variable would spell it."""
    if value is None:
        return ""
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (frozenset, set)):
        return ",".join(sorted(str(v) for v in value))
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={shown_pair(v)}" for k, v in sorted(value.items()))
    return str(value)


def shown_pair(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], float):  # a rate: calls/seconds
        return f"{value[0]}/{value[1]:g}"
    return str(value)


def _from_env(name: str, env: Mapping[str, str], field: str) -> str | None:
    """The value the environment's text of `name` gives, as shown (None: it does not parse on its own)."""
    try:
        return shown(getattr(Settings.from_env({name: env[name]}), field))
    except ConfigurationError:
        return None


def masked(name: str, value: str) -> str:
    """A setting's text with its secrets masked: a secret's whole value, a URL's credentials."""
    if not value:
        return value
    if name in SECRET:
        return MASK
    if name.endswith("_URL") or name == "OPENHUB_OIDC_ISSUER":
        return redact_url(value)
    return redact_text(value) or ""


def in_force(settings: Settings, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every setting with its value in force (secrets masked), where it came from (`store`: a live value;
    `environment`; `default`; `code`: given to the hub by its driver, e.g. openhub.testing.LocalHub), and
    whether it can change at run time."""
    defaults = Settings.from_env({})
    overrides = dict(settings.live_overrides)
    rows = []
    for name, fields in SETTINGS.items():
        value = shown(getattr(settings, fields[0]))
        if name in overrides:
            source, value = "store", overrides[name]
        elif name in env and _from_env(name, env, fields[0]) in (value, None):
            source = "environment"
        elif value == shown(getattr(defaults, fields[0])):
            source = "default"
        else:
            source = "code"
        if name in SECRET:
            value = MASK if getattr(settings, fields[0]) else ""
        rows.append({"name": name, "value": masked(name, value), "source": source, "live": name in LIVE})
    return rows
