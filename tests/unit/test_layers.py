"""The package's imports flow one way: no module imports, at its top or inside a function, a module
that imports it back (README.md, "Layout"). A cycle is how plumbing starts looping back on itself."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

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
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
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
                return stack[stack.index(nxt) :] + [nxt]
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


# The floors, lowest first (README.md, "Layout"): a module imports from its own floor and those below, never
# from one above. The drivers (api/, cli/, pipeline/, dev.py, testing.py and its external_system.py) sit on top of
# them all.
FLOORS = ["core", "store", "outbound", "celery", "engine", "service"]
# Up-imports left to undo (issue 35), each a function-level import: none may join them.
KNOWN_UP = {
    ("openhub.core.context", "openhub.store.workers"),  # StepContext.check_fence: the hub should hand it in
    ("openhub.core.registry", "openhub.outbound.notify"),  # the stock webhook, wired where the hub is built
    ("openhub.core.registry", "openhub.outbound.protocol"),  # the stock confirmer, likewise
}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


def _path(module: str) -> Path:
    return PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")


def test_no_import_goes_up_a_floor() -> None:
    def height(module: str) -> int:  # a driver, or the package's own lazy public API, is above every floor
        floor = _floor(module)
        return len(FLOORS) if floor is None else floor

    up = {
        (name, m)
        for name, deps in _graph().items()
        if _floor(name) is not None
        for m in deps
        if height(m) > height(name)
    }
    assert up == KNOWN_UP


def test_every_module_is_on_a_floor_or_a_driver() -> None:
    drivers = {"openhub", "openhub.dev", "openhub.testing", "openhub.external_system"}
    loose = [
        name
        for name in _graph()
        if _floor(name) is None
        and name not in drivers
        and name.split(".")[1] not in ("api", "cli", "pipeline", *FLOORS)
    ]
    assert loose == []


def test_the_core_floor_imports_no_framework() -> None:
    # The routing model, the state table, the retry policy, verdicts and keys, the step run: pure.
    for path in sorted((PACKAGE / "core").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
        } | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not imported & {"sqlalchemy", "celery", "kombu", "fastapi", "starlette"}, path.name


def test_the_engine_side_asks_the_registry_for_a_messages_route() -> None:
    """`Registry.route_of(row)` is the one way from a stored message to its route: the modules that
    carry messages never rebuild the route's name from its columns."""
    rebuilt = [
        name
        for name in (
            "engine.engine",
            "engine.entry",
            "engine.recording",
            "engine.lifecycle",
            "engine.due",
            "engine.followups",
            "engine.poller",
            "service.actions",
            "service.pauses",
            "service.breakers",
            "engine.funnel",
            "store.queries",
        )
        if ".service}.{" in _path(f"openhub.{name}").read_text()
    ]
    assert rebuilt == []


# Writes of a message's step lease and of the external-call records, in the ORM or in raw SQL.
LEASE_WRITES = re.compile(
    r"(update|delete|insert|insert_or_ignore)\(ext_calls\b|\bstep_run=|\bworker=None\b"  # the ORM's
    r"|(?i:insert\s+into\s+ext_calls\b|update\s+ext_calls\b|delete\s+from\s+ext_calls\b)"  # raw SQL's
    r"|(?i:\bstep_run\s*=\s*(?:NULL|:|v\.)|\bworker\s*=\s*(?:NULL|:))"  # a SET of the lease's columns
)
# The set-based forms of leases' writes for a batch on PostgreSQL: the same compare-and-set per member, built
# from what leases hands them (`leases.outcome_params`, `leases.lease`).
LEASE_WRITERS = {"leases.py", "batch_claims.py", "batch_writes.py"}


def test_the_lease_and_call_record_columns_have_one_writer() -> None:
    """`openhub.engine.leases` (and its set-based forms for a batch) is the only module that writes a message's
    step lease (`step_run`, `worker`) and the external-call records; the others ask it. (limits.py's
    `step_run` is a system slot's.)"""
    writers = sorted(
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        if path.name not in LEASE_WRITERS | {"limits.py"}
        and "migrations" not in path.parts  # the schema's history, not a writer at run time
        and LEASE_WRITES.search(path.read_text())
    )
    assert writers == []


@pytest.mark.parametrize(
    "line",
    [
        "conn.execute(update(ext_calls).where(X.key == key))",
        "UPDATE messages SET step_run = NULL, worker = NULL",
        "SET step_run = v.run, worker = :holder",
        "INSERT INTO ext_calls (key, message_id) SELECT ...",
        "values(step_run=run_id)",
    ],
)
def test_the_one_writer_rule_sees_raw_sql_and_the_orm(line: str) -> None:
    assert LEASE_WRITES.search(line)


def test_imports_under_type_checking_do_not_count() -> None:
    # model.py names StepContext for its type hints only; context.py imports model at run time.
    assert "openhub.core.context" not in _imports(PACKAGE / "core" / "model.py")


# The process's globals: its settings, its routes, its hub, and a transaction on (or the clock of) its database.
GLOBALS = {"get_settings", "get_registry", "current"}
GLOBAL_URL = {"transaction", "reading", "store_now"}  # openhub.store.db's, called with no URL: the process's database
# Every module below the drivers reads settings, routes, the publisher and the database from the hub it is
# given (a step run's, a transaction's `tx.hub`, a `hub` argument) or the settings a caller hands down, never
# from the process's globals (issue 35). The drivers, api/app.py api/server.py cli/ pipeline/ dev.py testing.py
# and tasks/, may read them; the rest of api/ serves the hub of the app answering, `openhub.api.served`.
# The one exception is where the globals are defined, and only inside their definitions: each function below
# may call the globals listed with it, and nothing else in its module calls any. (openhub.core.config defines
# `get_settings` and calls none: it hands the process's redaction names down to openhub.core.secret_shapes.)
DEFINED_AT = {
    "core/registry.py": {
        "get_registry": {"get_settings"},  # the process's own routes are loaded from the process's settings
    },
    "engine/hub.py": {
        "current": {"get_settings", "get_registry"},  # the process's hub, when no driver installed one
        "given": {"current"},  # the default of the entry points (`hub=None`): the process's hub
    },
}
DRIVERS = ("api/app.py", "api/server.py", "cli", "pipeline", "dev.py", "testing.py")


def _is_driver(name: str) -> bool:
    """Whether the module at `name` (a path under openhub/) is a driver's."""
    return name in DRIVERS or name.split("/")[0] in DRIVERS


def _global_calls(source: str | ast.AST) -> set[str]:
    """The process's globals a module's `source` (or a tree of it) calls: GLOBALS (bare or as `config.`,
    `registry.`, `hub.` attributes), and `transaction()`/`reading()`/`store_now()` (bare or `db.`) with no URL."""
    found = set()
    for node in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        on_module = isinstance(func, ast.Name) or (isinstance(func, ast.Attribute) and _is_name(func.value, "db"))
        if name in GLOBALS and (isinstance(func, ast.Name) or _is_name(func.value, "config", "registry", "hub")):
            found.add(name)
        elif name in GLOBAL_URL and on_module and not node.args and not any(k.arg == "url" for k in node.keywords):
            found.add(name)
    return found


def _is_name(node: ast.expr, *names: str) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _global_calls_by_place(name: str, source: str) -> dict[str, set[str]]:
    """The process's globals the module at `name` calls, by place: `name` for its body, `name:function` for a
    function of DEFINED_AT's (the module's own definitions of the globals)."""
    tree = ast.parse(source)
    defined = DEFINED_AT.get(name, {})
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in defined and (calls := _global_calls(node)):
            found[f"{name}:{node.name}"] = calls
    rest = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name in defined)]
    if calls := _global_calls(ast.Module(body=rest, type_ignores=[])):
        found[name] = calls
    return found


def test_below_the_drivers_modules_read_the_hub_they_are_given_not_the_process_globals() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if not _is_driver(name):
            found.update(_global_calls_by_place(name, path.read_text()))
    assert found == {
        f"{name}:{function}": calls for name, defined in DEFINED_AT.items() for function, calls in defined.items()
    }


def test_where_the_globals_are_defined_only_their_definitions_call_them() -> None:
    source = "def current():\n    return get_settings()\n\ndef other():\n    return get_registry()\n"
    assert _global_calls_by_place("engine/hub.py", source) == {
        "engine/hub.py:current": {"get_settings"},
        "engine/hub.py": {"get_registry"},
    }
    assert _global_calls_by_place("engine/engine.py", source) == {"engine/engine.py": {"get_settings", "get_registry"}}


def test_the_globals_rule_sees_each_way_of_calling_them() -> None:
    called = "get_settings()\nconfig.get_registry()\nhub.current()\ntransaction()\ndb.reading(first=True)\nstore_now()"
    assert _global_calls(called) == GLOBALS | GLOBAL_URL
    given = "transaction(url)\nreading(url=u)\nhub.transaction()\nrun.hub.reading()\ntx.hub.settings.x()\nstore_now(u)"
    assert _global_calls(given) == set()


# A function's parameter of these names left to its default (None) means the process's: its hub (`given`), its
# settings, its routes, its database.
HANDED_DOWN = ("hub", "settings", "registry", "url")


def _left_to_the_process(module: object, source: str) -> list[str]:
    """The calls in `source` (the text of `module`) of an openhub function, named bare or as a module's
    attribute, that leave one of its HANDED_DOWN parameters to its default of None."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func, target = node.func, None
        if isinstance(func, ast.Name):
            target = getattr(module, func.id, None)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = getattr(module, func.value.id, None)
            target = getattr(owner, func.attr, None) if inspect.ismodule(owner) else None
        if not callable(target) or not getattr(target, "__module__", "").startswith("openhub"):
            continue
        try:
            params = list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):
            continue
        passed = {k.arg for k in node.keywords}
        for i, param in enumerate(params):
            by_position = param.kind is not param.KEYWORD_ONLY and len(node.args) > i
            if param.name in HANDED_DOWN and param.default is None and param.name not in passed and not by_position:
                found.append(f"{ast.unparse(node)} ({param.name})")
    return found


def test_below_the_drivers_calls_hand_their_hub_down() -> None:
    """The other half of the globals rule: a module below the drivers that calls a function whose `hub`,
    `settings`, `registry` or `url` defaults to the process's passes its own (an endpoint: its served hub's),
    also where the globals are defined (DEFINED_AT)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if _is_driver(name) or "migrations" in path.parts:  # alembic's env runs on import
            continue
        module = importlib.import_module(_module_name(path))
        if calls := _left_to_the_process(module, path.read_text()):
            found[name] = calls
    assert found == {}


def test_the_handed_down_rule_sees_a_parameter_left_to_its_default() -> None:
    from openhub.api import batcher

    left = "producer.store_new(rows)\nproducer.prepare_item(item, now)\nproducer.store_new(rows, None, hub=None)"
    assert _left_to_the_process(batcher, left) == [
        "producer.store_new(rows) (hub)",
        "producer.prepare_item(item, now) (hub)",
    ]
