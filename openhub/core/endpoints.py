"""OPENHUB_CONFIRM_ENDPOINTS: where each source system takes the stock confirmation protocol
(openhub.outbound.protocol), set up without code.

Either `CRM=https://crm.example/openhub/confirm,ERP=https://…` (each with the defaults below), or a JSON
object by source system whose values are a URL or an object:

    {"CRM": {"url": "https://crm.example/openhub/confirm", "format": "json",
             "timeout": 10, "max_fails": "forever", "interval": 30, "backoff": 2, "max_interval": 600,
             "states": ["OK", "FAILED"], "headers": {"Authorization": "Bearer …"}}}

`format` json (default) or soap (the SOAP 1.1 variant); `timeout` seconds of one POST (default and at most
OPENHUB_CONFIRM_TIMEOUT); `max_fails` attempts before the confirmation is parked for an operator (a number,
or "forever"; default OPENHUB_CONFIRM_MAX_FAILS); `interval` seconds before the next attempt (default
OPENHUB_CONFIRM_INTERVAL), times `backoff` per failure up to `max_interval` (default a day); `states` the final states
confirmed (default OK, FAILED, CANCEL); `headers` sent with each POST (its credentials: they are never
logged). The signing secret is the system's OPENHUB_CONFIRM_SECRETS entry, which each endpoint must have.
This module imports no HTTP library and no settings: openhub.core.config reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from openhub.core.errors import ConfigurationError

NAME = "OPENHUB_CONFIRM_ENDPOINTS"
FINAL_STATES = frozenset({"OK", "FAILED", "CANCEL"})
FORMATS = ("json", "soap")
LONGEST = timedelta(days=1)  # the longest wait between two attempts without a max_interval
_KEYS = {"url", "format", "timeout", "max_fails", "interval", "backoff", "max_interval", "states", "headers"}


@dataclass(frozen=True)
class ConfirmEndpoint:
    """One source system's confirmation endpoint (module doc)."""

    system: str
    url: str
    format: str = "json"
    timeout: timedelta | None = None  # None: OPENHUB_CONFIRM_TIMEOUT
    max_fails: int | None = None  # None: OPENHUB_CONFIRM_MAX_FAILS; see `forever`
    forever: bool = False  # retried until it answers 2xx, never parked
    interval: timedelta | None = None  # None: OPENHUB_CONFIRM_INTERVAL
    backoff: float = 1.0
    max_interval: timedelta | None = None
    states: frozenset[str] = FINAL_STATES
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def retry_at(self, attempts: int, now: datetime, max_fails: int, interval: timedelta) -> datetime | None:
        """When the confirmation is sent again after its `attempts`-th failed send; None: parked. `max_fails`
        and `interval` are the hub's defaults (OPENHUB_CONFIRM_MAX_FAILS, OPENHUB_CONFIRM_INTERVAL)."""
        if not self.forever and attempts >= (self.max_fails if self.max_fails is not None else max_fails):
            return None
        base = (self.interval or interval).total_seconds()
        cap = (self.max_interval or max(LONGEST, self.interval or interval)).total_seconds()
        try:  # in floats, capped before it becomes a timedelta: `forever` with a backoff reaches any exponent
            seconds = min(base * self.backoff ** max(attempts - 1, 0), cap)
        except OverflowError:
            seconds = cap
        return now + timedelta(seconds=seconds)


def _seconds(system: str, key: str, value: Any) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(f"{NAME}: {system}'s {key} must be a positive number of seconds, got {value!r}")
    return timedelta(seconds=value)


def _endpoint(system: str, value: Any) -> ConfirmEndpoint:
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{NAME}: {system}'s endpoint must be a URL or an object, got {type(value).__name__}")
    unknown = set(value) - _KEYS
    if unknown:
        raise ConfigurationError(
            f"{NAME}: {system}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}"
        )
    url = value.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise ConfigurationError(f"{NAME}: {system}'s url must be an http(s) URL")
    fmt = value.get("format", "json")
    if fmt not in FORMATS:
        raise ConfigurationError(f"{NAME}: {system}'s format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    max_fails = value.get("max_fails")
    forever = max_fails == "forever"
    if (
        not forever
        and max_fails is not None
        and (isinstance(max_fails, bool) or not isinstance(max_fails, int) or max_fails < 1)
    ):
        raise ConfigurationError(
            f'{NAME}: {system}\'s max_fails must be a whole number >= 1 or "forever", got {max_fails!r}'
        )
    backoff = value.get("backoff", 1.0)
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or backoff < 1:
        raise ConfigurationError(f"{NAME}: {system}'s backoff must be a number >= 1, got {backoff!r}")
    states = value.get("states", sorted(FINAL_STATES))
    if isinstance(states, str):
        states = states.split("|")
    if not isinstance(states, list) or not states or not set(states) <= FINAL_STATES:
        raise ConfigurationError(
            f"{NAME}: {system}'s states must be a non-empty list of {', '.join(sorted(FINAL_STATES))}, got {states!r}"
        )
    headers = value.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ConfigurationError(f"{NAME}: {system}'s headers must be an object of header names to text")
    return ConfirmEndpoint(
        system=system,
        url=url,
        format=fmt,
        timeout=_seconds(system, "timeout", value.get("timeout")),
        max_fails=None if forever else max_fails,
        forever=forever,
        interval=_seconds(system, "interval", value.get("interval")),
        backoff=float(backoff),
        max_interval=_seconds(system, "max_interval", value.get("max_interval")),
        states=frozenset(states),
        headers=dict(headers),
    )


def parse_endpoints(raw: str) -> dict[str, ConfirmEndpoint]:
    """The endpoints OPENHUB_CONFIRM_ENDPOINTS names (module doc); ConfigurationError naming what is wrong
    (never a header's value)."""
    raw = raw.strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            given = json.loads(raw)
        except ValueError as exc:
            raise ConfigurationError(f"{NAME} is not valid JSON: {exc.args[0] if exc.args else exc}") from None
        if not isinstance(given, dict):
            raise ConfigurationError(f"{NAME} must be a JSON object by source system")
    else:
        given = {}
        for part in raw.split(","):
            system, eq, url = part.partition("=")
            if not eq or not system.strip():
                raise ConfigurationError(f"{NAME}: expected SYSTEM=url pairs separated by commas, got {part!r}")
            given[system.strip()] = url.strip()
    return {system: _endpoint(system, value) for system, value in given.items()}
