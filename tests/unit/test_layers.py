"""The package's imports flow one way: no module imports, at its top or inside a function, a module
that imports it back (README.md, "Layout"). A cycle is how plumbing starts looping back on itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import openhub

PACKAGE = Path(openhub.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The openhub modules a file imports anywhere except under `if TYPE_CHECKING:`."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())  # one tree: node ids from another parse would name other nodes
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
               for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.startswith("openhub"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("openhub"))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _graph()
    # A package's __init__ re-exports its members: importing the package is importing those.
    for name in graph:
        if any(other.startswith(name + ".") for other in graph):
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_routing_model_and_the_state_table_import_no_framework() -> None:
    # With them the pure parts of the engine: the retry policy, verdicts and keys, the step run.
    for name in ("model", "states", "errors", "context", "policy", "verdicts", "runs"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                    and not n.level} | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                                        for a in n.names}
        assert not imported & {"sqlalchemy", "celery", "kombu", "fastapi", "starlette"}, name


def test_the_engine_side_asks_the_registry_for_a_messages_route() -> None:
    """`Registry.route_of(row)` is the one way from a stored message to its route: the modules that
    carry messages never rebuild the route's name from its columns."""
    rebuilt = [(name, path) for name in ("engine", "lifecycle", "redrive", "poller", "operator", "funnel", "store")
               if '.service}.{' in (path := PACKAGE / f"{name}.py").read_text()]
    assert rebuilt == []


def test_the_lease_and_call_record_columns_have_one_writer() -> None:
    """`openhub.leases` is the only module that writes a message's step lease (`step_run`, `worker`)
    and the external-call records; the others ask it. (limits.py's `step_run` is a system slot's.)"""
    writes = re.compile(r"(update|delete|insert|insert_or_ignore)\(ext_calls\b|\bstep_run=|\bworker=None\b")
    writers = sorted(_module_name(path) for path in PACKAGE.rglob("*.py")
                     if path.name not in ("leases.py", "limits.py") and writes.search(path.read_text()))
    assert writers == []


def test_imports_under_type_checking_do_not_count() -> None:
    # model.py names StepContext for its type hints only; context.py imports model at run time.
    assert "openhub.context" not in _imports(PACKAGE / "model.py")


# Modules that read settings, routes and the clock from the hub they are given (a step run's), never
# from the process's globals: what a driver passes in is what they run with.
GIVEN_THE_HUB = ["engine.py", "runs.py"]


def test_the_engine_reads_the_hub_it_is_given_not_the_process_globals() -> None:
    for name in GIVEN_THE_HUB:
        calls = {node.func.id for node in ast.walk(ast.parse((PACKAGE / name).read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert not calls & {"get_settings", "get_registry"}, name
