"""The one place Celery's exceptions are read as openhub's own (as httpx's transport maps httpcore's).

The engine imports no Celery: a task passes `translate` to it, and what the engine must recognise
(a soft time limit arriving while it records a step's outcome) it recognises as openhub's own
exception. tests/unit/test_celery_exceptions.py checks that every Celery exception tasks/ imports is
mapped here.
"""

from __future__ import annotations

from celery.exceptions import SoftTimeLimitExceeded  # type: ignore[import-untyped]

from openhub.core.errors import Interrupted

# Celery's exception -> openhub's. A subclass is read as its closest mapped class.
FOREIGN: dict[type[BaseException], type[Exception]] = {
    SoftTimeLimitExceeded: Interrupted,
}


def translate(exc: BaseException) -> BaseException:
    """`exc` as openhub's own exception (caused by it), where it is one of Celery's; else `exc` itself."""
    for cls in type(exc).__mro__:
        own = FOREIGN.get(cls)
        if own is not None:
            mapped = own(str(exc))
            mapped.__cause__ = exc
            return mapped
    return exc
