"""Throttling of submissions per (source system, operation), OpenHub style.

Rules come from OPENHUB_THROTTLING as `system.operation=limit/interval` separated by commas,
e.g. `CRM.setCustomer=100/60,CRM.*=500/60,*.*=1000/60`; `*` matches any system or operation
and the most specific rule wins (an exact system beats an exact operation beats `*.*`). Each
(system, operation) pair has its own fixed-window counter: `limit` submissions per `interval`
seconds. Over the limit the ingress answers 429 with Retry-After (seconds to the next window).

Counters live in Redis when Redis is configured (INCR and EXPIRE in one pipeline, so every
ingress process shares them) and in process memory otherwise. If Redis cannot be reached the
limiter lets the request through and logs it: throttling protects the hub, it must not take
ingress down with it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from openhub.core.errors import ConfigurationError

log = logging.getLogger("openhub.api.throttle")


@dataclass(frozen=True)
class Rule:
    """`limit` submissions per `interval` seconds for a (system, operation) pattern."""

    system: str
    operation: str
    limit: int
    interval: int

    @property
    def specificity(self) -> tuple[int, int]:
        """Higher is more specific: an exact system counts more than an exact operation."""
        return (self.system != "*", self.operation != "*")

    def matches(self, system: str, operation: str) -> bool:
        """Whether the rule covers this pair."""
        return self.system in ("*", system) and self.operation in ("*", operation)


def parse_rules(text: str) -> list[Rule]:
    """Parse OPENHUB_THROTTLING; ConfigurationError names the malformed part."""
    rules: list[Rule] = []
    seen: set[tuple[str, str]] = set()
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        try:
            pattern, value = part.split("=", 1)
            system, operation = pattern.strip().split(".", 1)
            limit_text, interval_text = value.strip().split("/", 1)
            rule = Rule(system.strip(), operation.strip(), int(limit_text), int(interval_text))
        except ValueError:
            raise ConfigurationError(
                f"OPENHUB_THROTTLING: expected system.operation=limit/seconds, got {part!r}"
            ) from None
        if not rule.system or not rule.operation or rule.limit < 0 or rule.interval <= 0:
            raise ConfigurationError(f"OPENHUB_THROTTLING: bad rule {part!r} (limit >= 0, interval > 0 seconds)")
        if (rule.system, rule.operation) in seen:
            raise ConfigurationError(f"OPENHUB_THROTTLING: two rules for {rule.system}.{rule.operation}")
        seen.add((rule.system, rule.operation))
        rules.append(rule)
    return rules


def best_rule(rules: list[Rule], system: str, operation: str) -> Rule | None:
    """The most specific rule covering (system, operation), or None (not throttled)."""
    candidates = [r for r in rules if r.matches(system, operation)]
    return max(candidates, key=lambda r: r.specificity) if candidates else None


@dataclass(frozen=True)
class Verdict:
    """The limiter's answer: allowed, or refused with the seconds until the window resets."""

    allowed: bool
    retry_after: int = 0


class MemoryCounters:
    """Fixed-window counters in this process (the embedded default; one ingress process)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def hit(self, key: str, interval: int, amount: int = 1) -> tuple[int, float]:
        """Count `amount` hits; return (hits in the current window, seconds until it ends)."""
        now = self._clock()
        window = int(now // interval)
        with self._lock:
            if len(self._counts) > 10_000:  # forget past windows
                self._counts = {k: v for k, v in self._counts.items() if k[1] >= window}
            count = self._counts.get((key, window), 0) + amount
            self._counts[(key, window)] = count
        return count, (window + 1) * interval - now


class RedisCounters:
    """Fixed-window counters in Redis, shared by every ingress process and replica."""

    def __init__(self, url: str, prefix: str = "openhub:throttle:") -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._prefix = prefix

    def hit(self, key: str, interval: int, amount: int = 1) -> tuple[int, float]:
        """Count `amount` hits; return (hits in the current window, seconds until it ends)."""
        now = time.time()
        window = int(now // interval)
        name = f"{self._prefix}{key}:{interval}:{window}"
        pipe = self._redis.pipeline(transaction=True)
        pipe.incrby(name, amount)
        pipe.expire(name, interval + 1)
        count, _ = pipe.execute()
        return int(count), (window + 1) * interval - now


class Throttle:
    """Decides whether one more submission of (system, operation) is allowed now."""

    def __init__(self, rules: list[Rule], counters: MemoryCounters | RedisCounters) -> None:
        self.rules = rules
        self.counters = counters

    @classmethod
    def from_settings(cls, throttling: str, redis_url: str | None, prefix: str = "openhub:throttle:") -> "Throttle":
        """Rules from OPENHUB_THROTTLING; counters in Redis when `redis_url` is set."""
        counters = RedisCounters(redis_url, prefix) if redis_url else MemoryCounters()
        return cls(parse_rules(throttling), counters)

    def applies(self, system: str, operation: str) -> bool:
        """Whether any rule covers the pair (if not, `check` needs no counter and no I/O)."""
        return best_rule(self.rules, system, operation) is not None

    def exhausted(self, system: str, operations: list[str]) -> Verdict:
        """Refused when every one of `operations` is throttled for `system` and already at its limit.

        Counts nothing: it lets a batch be refused before its body is read and parsed, when no
        message in it could be accepted anyway.
        """
        waits = []
        for operation in operations:
            rule = best_rule(self.rules, system, operation)
            if rule is None:
                return Verdict(True)
            try:
                count, remaining = self.counters.hit(f"{system}.{operation}", rule.interval, 0)
            except Exception as exc:
                log.warning("throttling counters unavailable (%s); request not throttled", type(exc).__name__)
                return Verdict(True)
            if count < rule.limit:
                return Verdict(True)
            waits.append(remaining)
        return Verdict(False, max(1, math.ceil(min(waits)))) if waits else Verdict(True)

    def check(self, system: str, operation: str, hits: int = 1) -> Verdict:
        """Count `hits` submissions; refused when the window's count goes over the rule's limit."""
        rule = best_rule(self.rules, system, operation)
        if rule is None:
            return Verdict(True)
        key = f"{system}.{operation}"
        try:
            count, remaining = self.counters.hit(key, rule.interval, hits)
        except Exception as exc:
            log.warning("throttling counters unavailable (%s); request not throttled", type(exc).__name__)
            return Verdict(True)
        if count > rule.limit:
            return Verdict(False, max(1, math.ceil(remaining)))
        return Verdict(True)
