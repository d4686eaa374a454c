"""The error-code catalogue (openhub.core.codes) lists every code the hub assigns, and routes' own codes are
checked when they are loaded (openhub.core.declared)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import openhub
from openhub.core import codes
from openhub.core.config import get_settings
from openhub.core.declared import undeclared
from openhub.core.errors import ConfigurationError, Reject
from openhub.core.model import Route, step
from openhub.core.registry import Registry, build_registry

PACKAGE = Path(openhub.__file__).parent
# Where a code is handed to the store or a failure: keyword arguments, and these calls' positional ones.
CODE_KEYWORDS = {"code", "error_code"}
CODE_CALLS = {"Reject": 1, "_transient": 1, "business_error": 0, "http": 0}


def _assigned() -> list[tuple[str, int, str]]:
    """(file, line, code) of every literal the package's source passes or returns as an error code, and of
    every `codes.NAME` it uses (its value)."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "codes.py":
            continue
        tree = ast.parse(path.read_text())
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.keyword) and node.arg in CODE_KEYWORDS:
                values.append(node.value)
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in CODE_CALLS and len(node.args) > CODE_CALLS[name]:
                    values.append(node.args[CODE_CALLS[name]])
            elif isinstance(node, ast.FunctionDef) and "code" in node.name:
                values.extend(n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "codes"
                and node.attr.isupper()
            ):
                value = getattr(codes, node.attr, f"<no codes.{node.attr}>")
                if isinstance(value, str) and node.attr not in ("HTTP", "EXCEPTION"):
                    found.append((where, node.lineno, value))
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.append((where, node.lineno if hasattr(node, "lineno") else 0, value.value))
                elif isinstance(value, ast.JoinedStr):
                    found.append((where, getattr(node, "lineno", 0), "<f-string: build it with codes.http()>"))
    return found


def test_every_code_the_hub_assigns_is_in_the_catalogue() -> None:
    assigned = _assigned()
    assert len({c for _, _, c in assigned}) >= 14, assigned  # the scan sees the hub's codes at all
    missing = [(f, line, c) for f, line, c in assigned if c not in codes.CATALOGUE]
    assert not missing, f"codes the hub assigns that openhub/core/codes.py does not list: {missing}"


def test_every_constant_of_the_module_is_listed() -> None:
    constants = {v for k, v in vars(codes).items() if k.isupper() and isinstance(v, str)}
    assert constants <= set(codes.CATALOGUE), constants - set(codes.CATALOGUE)
    for entry in codes.CATALOGUE.values():
        assert entry.retried in ("yes", "no", "depends") and entry.meaning and entry.action


def test_the_scan_finds_a_literal_the_catalogue_lacks(tmp_path: Path) -> None:
    """The guard itself: a literal code handed to the store is caught."""
    tree = ast.parse('apply_event(tx, row, e, route, error_code="NOT_LISTED")')
    keyword = next(n for n in ast.walk(tree) if isinstance(n, ast.keyword))
    assert keyword.arg in CODE_KEYWORDS and keyword.value.value not in codes.CATALOGUE


def test_http_statuses_are_described_by_their_family() -> None:
    assert codes.describe("HTTP_422").retried == "no"
    assert codes.describe("HTTP_503").retried == "yes"
    assert codes.describe("HTTP_429").retried == "yes"
    assert codes.describe("ValueError") is None
    assert codes.is_hub_code("HTTP_404") and not codes.is_hub_code("E100")


@step
def refuses(ctx) -> None:
    raise Reject("no such customer", code="CUSTOMER_UNKNOWN")


@step
def refuses_computed(ctx) -> None:
    raise Reject("no such customer", code=ctx.payload["code"])


def test_a_route_must_declare_the_codes_its_steps_give_literally() -> None:
    assert undeclared(Route("crm.a", [refuses])) == {"refuses": {"CUSTOMER_UNKNOWN"}}
    assert undeclared(Route("crm.b", [refuses], errors={"CUSTOMER_UNKNOWN": "the CRM has no such customer"})) == {}
    assert undeclared(Route("crm.c", [refuses_computed])) == {}  # known only at run time: logged then
    registry = Registry()
    registry.add(Route("crm.a", [refuses]), "here")
    with pytest.raises(ConfigurationError, match="undeclared error code.*CUSTOMER_UNKNOWN"):
        registry.check()


def test_route_errors_are_checked_when_declared() -> None:
    with pytest.raises(ConfigurationError, match="hub's own"):
        Route("crm.a", [refuses], errors={"TIMEOUT": "mine"})
    with pytest.raises(ConfigurationError, match="meaning"):
        Route("crm.a", [refuses], errors={"E1": ""})
    with pytest.raises(ConfigurationError, match="letters"):
        Route("crm.a", [refuses], errors={"E 1": "spaces"})
    with pytest.raises(ConfigurationError, match="dict"):
        Route("crm.a", [refuses], errors=["E1"])


def test_the_example_routes_declare_their_codes() -> None:
    registry = build_registry(["routes"], get_settings())
    assert {"E100", "E402", "E410"} <= set(registry.declared_codes())
