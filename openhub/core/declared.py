"""The error codes a route's steps are seen to give, read from their source when the route is loaded.

A code written as a literal, `Reject("...", code="E100")`, `ctx.business_error("E100", ...)`, or a value
of the `business_errors` of an HttpCall the step uses, is known before the step runs: the registry refuses
a route whose steps give such a code that neither the route's `errors=` nor the hub's catalogue
(openhub.core.codes) lists. A code computed at run time cannot be read here; the engine logs it when a step
gives it undeclared, and `openhub errors` flags it among the codes found on messages.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import CodeType
from typing import Any, Callable

from openhub.core.codes import is_hub_code
from openhub.core.model import Route


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


_LITERAL: dict[CodeType, frozenset[str] | None] = {}  # a function body -> the literal codes its source gives


def _literal_codes(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The codes written as literals in `fn`'s source (None: its source cannot be read)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node)
        if name == "Reject":
            code = next((_literal(k.value) for k in node.keywords if k.arg == "code"), None)
            code = code or (_literal(node.args[1]) if len(node.args) > 1 else None)
        elif name == "business_error":
            code = next((_literal(k.value) for k in node.keywords if k.arg == "code"), None)
            code = code or (_literal(node.args[0]) if node.args else None)
        else:
            continue
        if code:
            found.add(code)
    return frozenset(found)


def codes_in(fn: Callable[..., Any]) -> set[str]:
    """The literal codes `fn`'s source gives (empty where its source cannot be read)."""
    # Its source is read once per function body (the code object getsource reads, under any decorator):
    # a process that builds registries again and again (a LocalHub per test, or per example of the promise
    # model) spent most of each build parsing the same steps' source.
    body = getattr(inspect.unwrap(fn), "__code__", None)
    if isinstance(body, CodeType):
        if body not in _LITERAL:
            _LITERAL[body] = _literal_codes(fn)
        literal = _LITERAL[body]
    else:
        literal = _literal_codes(fn)
    if literal is None:
        return set()
    found = set(literal)
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    for name in names:  # an HttpCall (any object with business_errors) the step uses
        value = getattr(fn, "__globals__", {}).get(name)
        business = getattr(value, "business_errors", None)
        if isinstance(business, dict):
            found.update(str(c) for c in business.values())
    return found


def undeclared(route: Route) -> dict[str, set[str]]:
    """Step key -> the literal codes its step gives that neither the route nor the hub declares."""
    declared = dict(route.errors)
    missing: dict[str, set[str]] = {}
    for item in route.steps:
        codes = {c for c in codes_in(item.fn) if c not in declared and not is_hub_code(c)}
        if codes:
            missing[item.key] = codes
    return missing


def is_declared(route: Route, code: str) -> bool:
    """Whether `code` is the hub's or one the route declares."""
    return is_hub_code(code) or any(code == declared for declared, _ in route.errors)
