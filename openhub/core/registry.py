"""Loading routes, confirmers and state hooks from the modules named by OPENHUB_ROUTES."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Protocol

from openhub.core.codes import Code
from openhub.core.config import Settings, get_settings
from openhub.core.declared import undeclared
from openhub.core.errors import ConfigurationError, UnknownRouteError
from openhub.core.model import RetryPolicy, Route, Split, route_name
from openhub.core.states import State
from openhub.core.topics import check_subscriptions

if TYPE_CHECKING:
    from openhub.core.context import Outcome

Confirmer = Callable[["Outcome"], None]
Hook = Callable[["Outcome"], None]


class MessageRow(Protocol):
    """What names a stored message's route: a row of `messages`, a view of it."""

    @property
    def service(self) -> str: ...

    @property
    def operation(self) -> str: ...


_MARK = "__openhub_confirms__"
_HOOK_MARK = "__openhub_on_state__"
_RETRY_MARK = "__openhub_confirm_retry__"
WEBHOOK = "webhook"  # the name of the stock hook OPENHUB_WEBHOOK_URL turns on


def confirmation(source_system: str, *, retry: RetryPolicy | None = None) -> Callable[[Confirmer], Confirmer]:
    """Declare the function that confirms final messages to `source_system` (one per system).

    `retry`: how its failed sends are retried (`RetryPolicy(max_fails=None)`: for ever; a send is parked
    FAILED_END when its failures would exceed `max_fails`); default OPENHUB_CONFIRM_MAX_FAILS and
    OPENHUB_CONFIRM_INTERVAL.

    It only marks the function: the registry collects confirmers from the route modules it loads,
    as it collects their `routes`, so two registries (two LocalHubs, two test backends) never share one.
    """
    if not isinstance(source_system, str) or not source_system:
        raise ConfigurationError("@confirmation needs a source system name")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"@confirmation({source_system!r}): retry must be a RetryPolicy, got {retry!r}")

    def mark(fn: Confirmer) -> Confirmer:
        setattr(fn, _MARK, source_system)
        setattr(fn, _RETRY_MARK, retry)
        return fn

    return mark


def on_state(*states: str) -> Callable[[Hook], Hook]:
    """Declare a function called with the message's `Outcome` each time a message enters one of
    `states` (any state but NEW): an alert on FAILED, a dead-letter feed, an audit trail.

    Called after the state is committed, from a notification row written in the same transaction,
    retried like a confirmation (OPENHUB_CONFIRM_INTERVAL, OPENHUB_CONFIRM_MAX_FAILS, then parked).
    """
    unknown = [s for s in states if s not in State.__members__ or s == "NEW"]
    if not states or unknown:
        raise ConfigurationError(f"@on_state needs message states other than NEW, got {unknown or 'none'}")

    def mark(fn: Hook) -> Hook:
        setattr(fn, _HOOK_MARK, frozenset(states))
        return fn

    return mark


def _hooks_in(module: ModuleType) -> list[tuple[str, frozenset[str], Hook]]:
    return [
        (f"{value.__module__}.{value.__qualname__}", getattr(value, _HOOK_MARK), value)
        for value in vars(module).values()
        if callable(value) and isinstance(getattr(value, _HOOK_MARK, None), frozenset)
    ]


def _confirmers_in(module: ModuleType) -> list[tuple[str, Confirmer]]:
    return [
        (getattr(value, _MARK), value)
        for value in vars(module).values()
        if callable(value) and isinstance(getattr(value, _MARK, None), str)
    ]


@dataclass
class Registry:
    """The routes and confirmers the hub serves."""

    routes: dict[str, Route] = field(default_factory=dict)
    confirmers: dict[str, Confirmer] = field(default_factory=dict)
    confirm_retries: dict[str, RetryPolicy] = field(default_factory=dict)  # source system -> its own policy
    hooks: dict[str, tuple[frozenset[str], Hook]] = field(default_factory=dict)  # name -> (states, function)

    def hooks_for(self, state: str) -> list[str]:
        """The names of the hooks a message entering `state` calls."""
        return [name for name, (states, _fn) in self.hooks.items() if state in states]

    def route(self, name: str) -> Route:
        """The route called `name`, or UnknownRouteError."""
        try:
            return self.routes[name]
        except KeyError:
            known = ", ".join(sorted(self.routes)) or "none"
            raise UnknownRouteError(f"unknown route {name!r} (known: {known})") from None

    def route_of(self, message: MessageRow) -> Route:
        """The route a stored message belongs to (by its `service` and `operation`), or UnknownRouteError."""
        return self.route(route_name(message.service, message.operation))

    def find_route_of(self, message: MessageRow) -> Route | None:
        """The route a stored message belongs to, or None when no loaded route has its name."""
        return self.routes.get(route_name(message.service, message.operation))

    def add(self, route: Route, origin: str) -> None:
        """Add a route, refusing a second route of the same name."""
        if not isinstance(route, Route):
            raise ConfigurationError(f"{origin}: `routes` must hold Route objects, got {route!r}")
        if route.name in self.routes:
            raise ConfigurationError(f"duplicate route {route.name!r} (again in {origin})")
        self.routes[route.name] = route

    def add_confirmer(self, source_system: str, fn: Confirmer) -> None:
        """Add a confirmer, refusing a second one for the same source system."""
        known = self.confirmers.get(source_system)
        if known is not None and known is not fn:
            raise ConfigurationError(
                f"two confirmers for source system {source_system!r}: "
                f"{known.__module__}.{known.__qualname__} and {fn.__module__}.{fn.__qualname__}"
            )
        self.confirmers[source_system] = fn
        retry = getattr(fn, _RETRY_MARK, None)
        if retry is not None:
            self.confirm_retries[source_system] = retry

    def declared_codes(self) -> dict[str, Code]:
        """The routes' own error codes (`Route(errors=)`); a code two routes declare names both."""
        found: dict[str, Code] = {}
        for route in self.routes.values():
            for code, entry in route.codes().items():
                known = found.get(code)
                found[code] = (
                    entry
                    if known is None
                    else Code(
                        code,
                        known.meaning if known.meaning == entry.meaning else f"{known.meaning} / {entry.meaning}",
                        known.retried,
                        known.action,
                        f"{known.origin}, {entry.origin}",
                    )
                )
        return found

    def check(self) -> None:
        """Cross-route checks: every Split's declared child route exists; every error code a step gives
        literally is declared (openhub.core.declared); every `subscribes=` names a loaded Topic."""
        check_subscriptions(self.routes)
        for route in self.routes.values():
            missing = undeclared(route)
            if missing:
                listed = "; ".join(f"step {k!r}: {', '.join(sorted(v))}" for k, v in sorted(missing.items()))
                raise ConfigurationError(
                    f"route {route.name!r}: undeclared error code(s) ({listed}); declare "
                    f"each with its meaning in Route(..., errors={{code: meaning}})"
                )
            for item in route.steps:
                if isinstance(item, Split) and item.route is not None and item.route not in self.routes:
                    raise ConfigurationError(
                        f"route {route.name!r}: Split {item.key!r} sends children to unknown route {item.route!r}"
                    )


def _modules(name: str) -> list[ModuleType]:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if exc.name and name.startswith(exc.name):
            raise ConfigurationError(f"OPENHUB_ROUTES names {name!r}, which cannot be imported: {exc}") from exc
        raise
    found = [module]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=name + "."):
            found.append(importlib.import_module(info.name))
    return found


def build_registry(module_names: tuple[str, ...] | list[str], settings: Settings) -> Registry:
    """Import the route modules (packages: every submodule) and collect their `routes` lists (and
    the stock webhook, where `settings` configure one)."""
    registry = Registry()
    for name in module_names:
        for module in _modules(name):
            for source_system, fn in _confirmers_in(module):
                registry.add_confirmer(source_system, fn)
            for hook_name, states, fn in _hooks_in(module):
                registry.hooks[hook_name] = (states, fn)
            declared = getattr(module, "routes", None)
            if declared is None:
                continue
            if not isinstance(declared, (list, tuple)):
                raise ConfigurationError(f"{module.__name__}.routes must be a list of Route")
            for route in declared:
                registry.add(route, module.__name__)
    if settings.confirm_endpoints:
        from openhub.outbound.protocol import stock_confirmer  # httpx is loaded only where an endpoint is configured

        for system, endpoint in settings.confirm_endpoints.items():
            registry.confirmers.setdefault(system, stock_confirmer(endpoint))  # a @confirmation overrides it
    if settings.webhook_url:
        from openhub.outbound.notify import webhook  # httpx is loaded only where a webhook is configured

        hook = on_state(*sorted(settings.webhook_states))(
            webhook(settings.webhook_url, settings.confirm_timeout.total_seconds())
        )  # checks the states
        registry.hooks[WEBHOOK] = (settings.webhook_states, hook)
    registry.check()
    return registry


_registry: Registry | None = None  # loaded from OPENHUB_ROUTES on first use
_served: Registry | None = None  # the registry of the hub installed in this process (openhub.engine.hub.install)


def get_registry() -> Registry:
    """The registry of the hub installed in this process (`openhub.engine.hub.install`), else the process's
    own, loaded from OPENHUB_ROUTES on first use."""
    global _registry
    if _served is not None:
        return _served
    if _registry is None:
        settings = get_settings()
        _registry = build_registry(settings.routes, settings)
    return _registry


def serve_registry(registry: Registry | None) -> None:
    """Answer `registry` from `get_registry()` until told otherwise (None: the environment's again);
    `openhub.engine.hub.install` calls it."""
    global _served
    _served = registry


def reset_registry() -> None:
    """Forget the loaded registry (tests)."""
    global _registry
    _registry = None
