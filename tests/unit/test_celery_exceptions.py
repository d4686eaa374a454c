"""tasks/exceptions.py reads every Celery exception tasks/ meets as openhub's own (as httpx's transport
maps every httpcore exception): the engine never matches a Celery class by name."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from openhub.core import errors

TASKS = Path(__file__).resolve().parents[2] / "tasks"


def _boundary() -> ModuleType:
    # Loaded by path: importing the `tasks` package builds the Celery app and registers every route.
    spec = importlib.util.spec_from_file_location("tasks_exceptions", TASKS / "exceptions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _celery_exceptions_in_tasks() -> set[type[BaseException]]:
    """The exception classes any module of tasks/ imports from Celery (or billiard, its pool)."""
    found: set[type[BaseException]] = set()
    for path in TASKS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and not node.level
                and node.module.split(".")[0] in ("celery", "billiard")
            ):
                module = importlib.import_module(node.module)
                found.update(
                    c
                    for a in node.names
                    if isinstance(c := getattr(module, a.name), type) and issubclass(c, BaseException)
                )
    return found


def test_every_celery_exception_tasks_meet_is_mapped() -> None:
    met = _celery_exceptions_in_tasks()
    assert met, "tasks/ imports Celery's SoftTimeLimitExceeded at least"
    unmapped = sorted(c.__name__ for c in met if not any(issubclass(c, f) for f in _boundary().FOREIGN))
    assert unmapped == []


def test_each_becomes_openhubs_own_exception_caused_by_it() -> None:
    boundary = _boundary()
    for foreign, own in boundary.FOREIGN.items():
        assert own.__module__ == errors.__name__
        exc = foreign("the step ran over its timeout of 1 s")
        mapped = boundary.translate(exc)
        assert type(mapped) is own and mapped.__cause__ is exc and str(exc) in str(mapped)


def test_the_rest_passes_as_it_is() -> None:
    exc = ValueError("a bug")
    assert _boundary().translate(exc) is exc
