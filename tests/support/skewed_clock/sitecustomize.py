"""A host whose clock is off, for the multi-host rig (tests/support/hosts.py): put this folder first
on PYTHONPATH and name a file in OPENHUB_TEST_SKEW_FILE holding the offset in seconds ("90", "-90",
"0"); the process's wall clock (time.time, datetime.now/utcnow) is that far off, re-read each second,
so a running worker's clock can be shifted. Monotonic time and sleeps are untouched, as on a host
whose wall clock alone is wrong.

libfaketime would do this below Python, but its clock_nanosleep breaks Python's time.sleep (EINVAL)
when monotonic time is left real, and faking monotonic time too stalls sleeps when the offset moves.
"""

from __future__ import annotations

import datetime as _dt
import os
import time as _time

_FILE = os.environ.get("OPENHUB_TEST_SKEW_FILE")
_real_time, _real_time_ns, _monotonic = _time.time, _time.time_ns, _time.monotonic
_cache = [0.0, float("-inf")]  # offset, monotonic time it was read


def _offset() -> float:
    now = _monotonic()
    if now - _cache[1] >= 1.0:
        try:
            with open(_FILE or "") as f:
                _cache[0] = float(f.read().strip() or 0)
        except (OSError, ValueError):
            _cache[0] = 0.0
        _cache[1] = now
    return _cache[0]


_real_datetime = _dt.datetime


class _AnyDatetime(type):
    """Every datetime is one: those that C code makes (a database driver's) are the real type, and the
    hub's `isinstance(value, datetime)` must still take them (a split child's inherited timestamp)."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _real_datetime)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _real_datetime)


class _SkewedDatetime(_dt.datetime, metaclass=_AnyDatetime):
    __slots__ = ()  # the size of a datetime, as compiled modules that import the type check

    @classmethod
    def now(cls, tz=None):
        return super().now(tz) + _dt.timedelta(seconds=_offset())

    @classmethod
    def utcnow(cls):
        return super().utcnow() + _dt.timedelta(seconds=_offset())

    @classmethod
    def today(cls):
        return cls.now()


if _FILE:
    _time.time = lambda: _real_time() + _offset()
    _time.time_ns = lambda: _real_time_ns() + int(_offset() * 1e9)
    _dt.datetime = _SkewedDatetime  # type: ignore[misc]
