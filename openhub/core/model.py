"""The routing model: routes, steps, splits and retry policies as plain frozen dataclasses.

Everything is validated when it is declared, so a typo fails at import time, not at 3 a.m.
This module imports no Celery, SQLAlchemy or FastAPI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Literal, Union

from openhub.core.codes import CODE, Code, is_hub_code
from openhub.core.errors import ConfigurationError
from openhub.core.soap_route import Soap as Soap  # declared there, still importable from here

if TYPE_CHECKING:
    from openhub.core.context import StepContext

ROUTE_NAME = re.compile(r"^[A-Za-z][\w-]*\.[A-Za-z][\w-]*$")
STEP_KEY = re.compile(r"^[A-Za-z_][\w-]*$")
Scope = Literal["message", "entity", "custom"]
SCOPES = ("message", "entity", "custom")


def _seconds(value: timedelta | float | int | None, what: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ConfigurationError(f"{what} must be a positive timedelta, got {value!r}")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how far apart a failing message is retried.

    The n-th failure waits ``interval * backoff ** (n - 1)``, at most ``max_interval``; the
    message is FAILED when its failed count would exceed ``max_fails``. ``max_fails=None`` retries
    for ever (a growing back-off then needs its cap, ``max_interval``).
    """

    max_fails: int | None = 3
    interval: timedelta = timedelta(seconds=60)
    backoff: float = 1.0
    max_interval: timedelta | None = None

    def __post_init__(self) -> None:
        if self.max_fails is not None and (
            not isinstance(self.max_fails, int) or isinstance(self.max_fails, bool) or self.max_fails < 0
        ):
            raise ConfigurationError(
                f"RetryPolicy.max_fails must be an int >= 0 or None (for ever), got {self.max_fails!r}"
            )
        object.__setattr__(self, "interval", _seconds(self.interval, "RetryPolicy.interval"))
        object.__setattr__(self, "max_interval", _seconds(self.max_interval, "RetryPolicy.max_interval"))
        if not isinstance(self.backoff, (int, float)) or self.backoff < 1:
            raise ConfigurationError(f"RetryPolicy.backoff must be a number >= 1, got {self.backoff!r}")
        if self.max_fails is None and self.backoff > 1 and self.max_interval is None:
            raise ConfigurationError(
                "RetryPolicy(max_fails=None) with a backoff > 1 needs max_interval: "
                "a back-off without a cap would wait longer than any outage lasts"
            )

    @property
    def forever(self) -> bool:
        """Whether failures are retried without end."""
        return self.max_fails is None

    def delay(self, failed_count: int) -> timedelta:
        """The wait before the next attempt after `failed_count` failures (at most `max_interval`)."""
        try:
            wait = self.interval * (self.backoff ** max(failed_count - 1, 0))
        except OverflowError:  # the thousandth failure of a doubling back-off: far past any cap
            wait = timedelta.max
        if self.max_interval is not None:
            wait = min(wait, self.max_interval)
        return wait


@dataclass(frozen=True)
class Step:
    """A step of a route: one call to an external system, guarded by its idempotency key."""

    fn: Callable[["StepContext"], Any]
    key: str
    scope: Scope = "message"
    custom_key: Callable[["StepContext"], str] | None = None
    timeout: timedelta | None = None
    queue: str | None = None
    retry: RetryPolicy | None = None
    fatal: tuple[type[BaseException], ...] = ()  # exceptions that fail the message at once (besides Reject)
    system: str | None = None  # the external system it calls: its steps share a circuit breaker

    @property
    def name(self) -> str:
        """The step's name in task names and listings (its key)."""
        return self.key

    def __call__(self, ctx: "StepContext") -> Any:
        return self.fn(ctx)


_STEP_OPTIONS = {"key", "scope", "custom_key", "timeout", "queue", "retry", "fatal", "system"}


def _fatal(value: Any, owner: str) -> tuple[type[BaseException], ...]:
    """`fatal=` as a tuple of exception classes; ConfigurationError for anything else."""
    if value is None:
        return ()
    classes = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ConfigurationError(f"{owner}: fatal= takes exception classes, got {cls!r}")
    return classes


def step(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a route step: ``@step`` or ``@step(key=..., scope=..., timeout=..., queue=..., retry=...,
    fatal=(SomeError,), system="billing")``."""
    unknown = set(options) - _STEP_OPTIONS
    if unknown:
        raise ConfigurationError(f"unknown @step option(s): {', '.join(sorted(unknown))}")

    def declare(func: Callable[..., Any]) -> Step:
        if not callable(func):
            raise ConfigurationError(f"@step must decorate a function, got {func!r}")
        key = options.get("key") or func.__name__
        if not isinstance(key, str) or not STEP_KEY.match(key):
            raise ConfigurationError(f"step key {key!r} of {func.__name__} must be an identifier")
        scope = options.get("scope", "message")
        if scope not in SCOPES:
            raise ConfigurationError(f"step {key!r}: scope must be one of {SCOPES}, got {scope!r}")
        custom_key = options.get("custom_key")
        if scope == "custom" and not callable(custom_key):
            raise ConfigurationError(f"step {key!r}: scope='custom' needs custom_key=callable")
        if scope != "custom" and custom_key is not None:
            raise ConfigurationError(f"step {key!r}: custom_key is only allowed with scope='custom'")
        retry = options.get("retry")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"step {key!r}: retry must be a RetryPolicy")
        queue = options.get("queue")
        if queue is not None and not isinstance(queue, str):
            raise ConfigurationError(f"step {key!r}: queue must be a string")
        system = options.get("system")
        if system is not None and not (isinstance(system, str) and 0 < len(system) <= 100):
            raise ConfigurationError(f"step {key!r}: system must be a name of 1..100 characters")
        return Step(
            fn=func,
            key=key,
            scope=scope,
            custom_key=custom_key,
            timeout=_seconds(options.get("timeout"), f"step {key!r} timeout"),
            queue=queue,
            retry=retry,
            fatal=_fatal(options.get("fatal"), f"step {key!r}"),
            system=system,
        )

    if fn is not None:
        return declare(fn)
    return declare


@dataclass(frozen=True)
class Child:
    """A child message produced by a Split: routed to `route` with its own payload."""

    route: str
    payload: Any
    object_id: str | None = None
    funnel: str | None = None
    entity_type: str | None = None


@dataclass(frozen=True)
class Split:
    """A step that splits the message into child messages; the parent waits until all are final.

    `bound=False`: independent children: the parent goes on at once, neither held nor failed by them,
    nor cancelled or restarted with them; each still names its parent (`parent_id`)."""

    fn: Callable[["StepContext"], list[Child]]
    key: str = ""
    route: str | None = None  # the child route, when all children go to one: checked at load
    queue: str | None = None
    timeout: timedelta | None = None
    sequential: bool = False  # children run one after another, in list order (a failure stops the rest)
    confirm_children: bool = False  # confirm each child to the source system too (it never sent their ids)
    bound: bool = True  # False: the parent neither waits for its children nor fails with them

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigurationError(f"Split needs a callable, got {self.fn!r}")
        key = self.key or getattr(self.fn, "__name__", "split")
        if not STEP_KEY.match(key):
            raise ConfigurationError(f"Split key {key!r} must be an identifier")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "timeout", _seconds(self.timeout, f"Split {key!r} timeout"))
        for flag in ("sequential", "confirm_children", "bound"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigurationError(f"Split {key!r}: {flag} must be True or False")
        if self.sequential and not self.bound:
            raise ConfigurationError(f"Split {key!r}: sequential children need a parent that waits (bound=True)")

    scope: Scope = field(default="message", init=False)
    retry: RetryPolicy | None = field(default=None, init=False)
    fatal: tuple[type[BaseException], ...] = field(default=(), init=False)

    @property
    def name(self) -> str:
        """The split's name in task names and listings (its key)."""
        return self.key


RouteStep = Union[Step, Split]


def _check_batch(name: str, steps: tuple[RouteStep, ...], options: dict[str, Any]) -> None:
    """A batch task carries its messages through the whole route on one worker: one queue for all steps."""
    batch = options.get("batch")
    if batch is None:
        return
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigurationError(f"route {name!r}: batch must be a whole number of messages >= 1 (or None)")
    queue = steps[0].queue or options.get("queue")
    for item in steps[1:]:
        if (item.queue or options.get("queue")) != queue:
            raise ConfigurationError(
                f"route {name!r}: batch needs all steps on one queue; step {item.key!r} is on "
                f"{item.queue or options.get('queue')!r}, step {steps[0].key!r} on {queue!r}"
            )


_ROUTE_OPTIONS = {
    "object_id",
    "entity_type",
    "funnel",
    "guaranteed_order",
    "exclude_failed",
    "validate",
    "retry",
    "priority",
    "queue",
    "order_timeout",
    "fatal",
    "fused",
    "batch",
    "expires_after",
    "sources",
    "responders",
    "secret_fields",
    "soap",
    "backlog_limit",
    "errors",
    "sync",
    "subscribes",
}


def _errors(name: str, value: Any) -> tuple[tuple[str, str], ...]:
    """`errors=` as (code, meaning) pairs; ConfigurationError for a malformed one or a hub code reused."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigurationError(f"route {name!r}: errors must be a dict of code -> meaning")
    for code, meaning in value.items():
        if not isinstance(code, str) or not CODE.match(code):
            raise ConfigurationError(f"route {name!r}: error code {code!r} must be 1..100 letters, digits, _ . -")
        if is_hub_code(code):
            raise ConfigurationError(f"route {name!r}: error code {code!r} is the hub's own (openhub errors)")
        if not isinstance(meaning, str) or not meaning.strip():
            raise ConfigurationError(f"route {name!r}: error code {code!r} needs its meaning as text")
    return tuple(sorted(value.items()))


def route_name(service: str, operation: str) -> str:
    """The name of the route of `service` and `operation`, as a stored message names it (and as shown)."""
    return f"{service}.{operation}"


@dataclass(frozen=True, init=False)
class Route:
    """A named chain of steps that messages for `service.operation` go through, top to bottom."""

    name: str
    steps: tuple[RouteStep, ...]
    object_id: Callable[[Any], Any] | None = None
    entity_type: str | None = None
    funnel: Callable[[Any], Any] | None = None
    guaranteed_order: bool = False
    exclude_failed: bool = False
    validate: Any = None
    retry: RetryPolicy | None = None
    priority: int | None = None
    queue: str | None = None
    order_timeout: timedelta | None = None
    fatal: tuple[type[BaseException], ...] = ()  # exceptions that fail its messages at once, in every step
    fused: bool = False  # consecutive steps on one queue run in one Celery task (`dispatch.task_end`)
    # Up to this many messages in one Celery task, each carried from its first step to the route's end,
    # step by step in lockstep (openhub.engine.batch); all the route's steps on one queue.
    batch: int | None = None
    expires_after: timedelta | None = None  # a message not started by then ends FAILED (error code EXPIRED)
    backlog_limit: int | None = None  # its messages not yet final at most; past it submissions are refused (429)
    # The source systems whose keys may submit its messages (empty: any source system's key).
    sources: tuple[str, ...] = ()
    # The source systems whose keys may POST the response its waits expect (the admin token always may;
    # empty: the admin token or the message's own source system), e.g. the bank answering a payment the shop submitted.
    responders: tuple[str, ...] = ()
    # Dotted paths of payload fields that hold secrets (`card.pin`; through lists: `lines.pin`): their values
    # are redacted from every text the hub keeps or exports, and shown as `[redacted]` in the payload readers
    # see (the stored payload keeps them for the steps).
    secret_fields: tuple[str, ...] = ()
    # Its SOAP ingress (`Soap(xsd=..., element=...)`): also served at /soap/{service}, the WSDL at ?wsdl.
    soap: Soap | None = None
    # The route's own error codes and what each means (`errors={"E100": "an order without lines"}`): the codes
    # its steps give Reject(code=), ctx.business_error() and an HttpCall's business_errors (openhub.core.codes).
    errors: tuple[tuple[str, str], ...] = ()
    # The HTTP caller waits for the route's result (its last step's return value, JSON) up to a bounded time,
    # then gets it with 200; past that time, 202 and the message goes on as any other (openhub.api.sync).
    sync: bool = False
    # The topics (openhub.core.topics.Topic) whose messages this route receives, each as a message of its own.
    subscribes: tuple[str, ...] = ()

    def __init__(self, name: str, steps: list[RouteStep] | tuple[RouteStep, ...] = (), **options: Any) -> None:
        unknown = set(options) - _ROUTE_OPTIONS
        if unknown:
            raise ConfigurationError(f"route {name!r}: unknown option(s) {', '.join(sorted(unknown))}")
        if not isinstance(name, str) or not ROUTE_NAME.match(name):
            raise ConfigurationError(f"route name {name!r} must look like 'service.operation'")
        steps = tuple(steps)
        if not steps:
            raise ConfigurationError(f"route {name!r} has no steps")
        seen: set[str] = set()
        for item in steps:
            if not isinstance(item, (Step, Split)):
                label = getattr(item, "__name__", repr(item))
                raise ConfigurationError(f"route {name!r}: {label} is not a @step (decorate it with @step)")
            if item.key in seen:
                raise ConfigurationError(f"route {name!r}: duplicate step key {item.key!r}")
            seen.add(item.key)
        splits = [item for item in steps if isinstance(item, Split)]
        if len(splits) > 1 and not all(s.bound for s in splits):
            raise ConfigurationError(
                f"route {name!r}: an unbound Split must be the route's only Split "
                "(the children of one generation are one family)"
            )
        for opt in ("object_id", "funnel"):
            if options.get(opt) is not None and not callable(options[opt]):
                raise ConfigurationError(f"route {name!r}: {opt} must be a callable of the payload")
        validate = options.get("validate")
        if validate is not None and not callable(validate):
            raise ConfigurationError(f"route {name!r}: validate must be a callable or a pydantic model")
        retry = options.get("retry")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"route {name!r}: retry must be a RetryPolicy")
        priority = options.get("priority")
        if priority is not None and (not isinstance(priority, int) or not 0 <= priority <= 9):
            raise ConfigurationError(f"route {name!r}: priority must be an int 0..9")
        backlog = options.get("backlog_limit")
        if backlog is not None and (isinstance(backlog, bool) or not isinstance(backlog, int) or backlog < 1):
            raise ConfigurationError(f"route {name!r}: backlog_limit must be a whole number of messages >= 1 (or None)")
        if options.get("exclude_failed") and not options.get("guaranteed_order"):
            raise ConfigurationError(f"route {name!r}: exclude_failed needs guaranteed_order=True")
        if not isinstance(options.get("fused", False), bool):
            raise ConfigurationError(f"route {name!r}: fused must be True or False")
        _check_batch(name, steps, options)
        if not isinstance(options.get("sync", False), bool):
            raise ConfigurationError(f"route {name!r}: sync must be True or False")
        if options.get("sync") and options.get("batch") is not None:
            raise ConfigurationError(f"route {name!r}: a sync route cannot be batched (its caller waits for it alone)")
        if options.get("guaranteed_order") and options.get("funnel") is None:
            raise ConfigurationError(f"route {name!r}: guaranteed_order needs a funnel")
        for opt in ("sources", "responders"):
            names = options.get(opt, ())
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
                raise ConfigurationError(f"route {name!r}: {opt} must be a list of source system names")
            options[opt] = tuple(names)
        fields = options.get("secret_fields", ())
        if isinstance(fields, str) or not all(isinstance(f, str) and f and "" not in f.split(".") for f in fields):
            raise ConfigurationError(f"route {name!r}: secret_fields must be a list of dotted field paths (card.pin)")
        options["secret_fields"] = tuple(fields)
        topics = options.get("subscribes", ())
        topics = (topics,) if isinstance(topics, str) else topics
        if not isinstance(topics, (list, tuple)) or not all(isinstance(t, str) and ROUTE_NAME.match(t) for t in topics):
            raise ConfigurationError(f"route {name!r}: subscribes must name topics ('order.created' or a list of them)")
        options["subscribes"] = tuple(topics)
        if options.get("soap") is not None and not isinstance(options["soap"], Soap):
            raise ConfigurationError(f"route {name!r}: soap must be a Soap(xsd=..., element=...)")
        options["errors"] = _errors(name, options.get("errors"))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "steps", steps)
        for opt in _ROUTE_OPTIONS:
            default = self.__dataclass_fields__[opt].default
            object.__setattr__(self, opt, options.get(opt, default))
        object.__setattr__(self, "order_timeout", _seconds(self.order_timeout, f"route {name!r} order_timeout"))
        object.__setattr__(self, "expires_after", _seconds(self.expires_after, f"route {name!r} expires_after"))
        object.__setattr__(self, "fatal", _fatal(self.fatal, f"route {name!r}"))

    def codes(self) -> dict[str, Code]:
        """The route's declared error codes as catalogue entries."""
        return {
            code: Code(
                code,
                meaning,
                "no",
                "The route's own refusal: read the message's error; the source system fixes the data and sends "
                "it again.",
                origin=self.name,
            )
            for code, meaning in self.errors
        }

    @property
    def service(self) -> str:
        """The part of the name before the dot."""
        return self.name.split(".", 1)[0]

    @property
    def operation(self) -> str:
        """The part of the name after the dot."""
        return self.name.split(".", 1)[1]

    def step_queue(self, item: RouteStep) -> str | None:
        """The queue a step's task goes to (None: Celery's default queue)."""
        return item.queue or self.queue

    def index_of(self, key: str) -> int:
        """Position of the step with `key` in this route."""
        for i, item in enumerate(self.steps):
            if item.key == key:
                return i
        raise KeyError(key)
