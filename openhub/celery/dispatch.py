"""The Celery adapter: the one module of the library that talks to Celery.

It builds the Celery application from `celeryconfig.py`, turns a route into a chain of
signatures (one task per step, named `openhub.<service>.<operation>.<step>`, or one per run of
steps for a fused route; a batch route's messages go in tasks of up to `batch` messages each,
`openhub.<service>.<operation>.batch`) and publishes it: `CeleryPublisher` is the `Publisher` of a hub
(openhub.engine.hub) that hands its work to Celery; `openhub.testing.LocalHub`'s keeps the chains in this process.
Celery is imported lazily so that the routing model and reading messages need no broker.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Collection, Protocol, Sequence

from openhub.core.config import Settings
from openhub.core.errors import ConfigurationError
from openhub.core.model import Route, RouteStep
from openhub.core.policy import step_timeout
from openhub.core.tracing import continuing

if TYPE_CHECKING:
    from celery import Celery  # type: ignore[import-untyped]

log = logging.getLogger("openhub.dispatch")
_app: "Celery | None" = None
POLL_TASK = "openhub.poll"
CHAIN_FAILED_TASK = "openhub.chain_failed"
CONFIRM_TASK = "openhub.confirm"
# Seconds between the soft time limit (an exception in the step) and the hard kill of the process: the
# time a step that ran to its limit still has to record its outcome through a store outage.
HARD_LIMIT_MARGIN = 60.0


def _celeryconfig() -> Any:
    name = os.environ.get("OPENHUB_CELERY_CONFIG", "celeryconfig")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise ConfigurationError(
            f"Celery configuration module {name!r} not found: run from the project "
            "directory (where celeryconfig.py is) or set OPENHUB_CELERY_CONFIG"
        ) from None


_app_lock = threading.Lock()


def celery_app() -> "Celery":
    """The process's Celery application, configured from celeryconfig.py (thread-safe)."""
    global _app
    if _app is None:
        with _app_lock:  # celery's lazy module attributes are not safe to import from two threads at once
            if _app is None:
                from celery import Celery
                from celery.canvas import chain  # type: ignore[import-untyped]  # noqa: F401 - loaded here, under the lock

                app = Celery("openhub")
                app.config_from_object(_celeryconfig())
                _app = app
    return _app


def reset_app() -> None:
    """Forget the Celery application (tests switching brokers; the next call re-reads celeryconfig)."""
    global _app
    _app = None
    sys.modules.pop(os.environ.get("OPENHUB_CELERY_CONFIG", "celeryconfig"), None)


def task_name(route: Route, item: RouteStep) -> str:
    """The Celery task name of one of the route's steps (what Flower shows)."""
    return f"openhub.{route.name}.{item.name}"


def task_end(route: Route, index: int) -> int:
    """Where the Celery task that starts at step `index` stops: after that step in chain mode; in
    fused mode after the last of the consecutive steps that share its queue.

    Every step is still claimed, leased, guarded by its external-call record and recorded on its
    own; fused mode only saves the broker round trip between steps.
    """
    end = index + 1
    if route.batch:  # a batch task carries its messages to the route's end (all its steps share a queue)
        return len(route.steps)
    if route.fused:
        queue = route.step_queue(route.steps[index])
        while end < len(route.steps) and route.step_queue(route.steps[end]) == queue:
            end += 1
    return end


def task_starts(route: Route, start: int = 0) -> list[int]:
    """The steps, from `start` on, at which a Celery task of the route begins."""
    starts = []
    while start < len(route.steps):
        starts.append(start)
        start = task_end(route, start)
    return starts


def broker_priority(priority: int, settings: Settings) -> int:
    """The Celery task priority that makes a message of `priority` (0-9, higher = sooner, the hub's one
    direction) go sooner on the configured broker. RabbitMQ's priority queues (`x-max-priority`) take the
    higher number first, as the hub does; kombu's Redis emulation takes the lower first (its list for
    priority 0 is the first its BRPOP names, then 3, 6, 9), so there it is 9 - priority. The embedded
    broker has no priorities (the value is carried, and shown in Flower, but not honoured)."""
    return 9 - priority if settings.broker == "redis" else priority


def task_options(route: Route, index: int, settings: Settings, priority: int | None = None) -> dict[str, Any]:
    """Celery options of the task that starts at step `index`: queue, priority and time limits.

    A fused task may run as long as all its steps together; each step keeps its own limit inside it.
    `priority`: the message's (None: the route's, else OPENHUB_DEFAULT_PRIORITY), as the broker takes it.
    """
    steps = route.steps[index : task_end(route, index)]
    timeout = sum(step_timeout(item, settings).total_seconds() for item in steps)
    options: dict[str, Any] = {"soft_time_limit": timeout, "time_limit": timeout + HARD_LIMIT_MARGIN}
    queue = route.step_queue(route.steps[index])
    if queue:
        options["queue"] = queue
    if priority is None:
        priority = route.priority if route.priority is not None else settings.default_priority
    options["priority"] = broker_priority(priority, settings)
    return options


def batch_task_name(route: Route) -> str:
    """The Celery task name of a batch route's tasks (what Flower shows)."""
    return f"openhub.{route.name}.batch"


# One batch task's share of the chains: the route, its first step, (message id, token) pairs, and the
# priority of the task (its messages', the highest first).
Batch = tuple[Route, int, list[tuple[int, str]], int | None]


def batches(chains: Sequence["Chain"]) -> tuple[list["Chain"], list[Batch]]:
    """Split the chains into those of ordinary routes, in order, and the tasks that carry those of batch
    routes: grouped by (route, first step, priority), the higher priorities' first and each in order of
    publishing, up to `route.batch` messages each. A batch never mixes priorities: an urgent message is
    not held behind the messages of a lower one, nor do they ride ahead with it. ValueError for a chain
    that starts at a step its route does not have."""
    single: list[Chain] = []
    groups: dict[tuple[str, int, int | None], list[Batch]] = {}
    for chain in chains:
        route, message_id, token, start, _trace, priority = chain
        if not 0 <= start < len(route.steps):
            raise ValueError(f"message {message_id}: route {route.name} has no step {start} to start at")
        if not route.batch:
            single.append(chain)
            continue
        tasks = groups.setdefault((route.name, start, priority), [])
        if not tasks or len(tasks[-1][2]) >= route.batch:
            tasks.append((route, start, [], priority))
        tasks[-1][2].append((message_id, token))
    order = sorted(groups, key=lambda key: -(key[2] if key[2] is not None else -1))  # stable: publishing order
    return single, [task for key in order for task in groups[key]]


def batch_options(
    route: Route, start: int, size: int, settings: Settings, priority: int | None = None
) -> dict[str, Any]:
    """Celery options of a batch task of `size` messages from step `start`: those of a task over the
    route's steps from there, its time limits once per message (the prefork pool runs the messages'
    steps one after another; `tasks.steps.register_step_tasks` checks a full batch against the
    broker's visibility timeout)."""
    options = task_options(route, start, settings, priority)
    timeout = options["soft_time_limit"] * size
    return {**options, "soft_time_limit": timeout, "time_limit": timeout + HARD_LIMIT_MARGIN}


def batch_signature(task: Batch, settings: Settings) -> Any:
    """The Celery task that carries a batch: args (pairs, first step); Flower shows the message ids."""
    route, start, pairs, priority = task
    shown = {
        "argsrepr": f"messages {', '.join(str(m) for m, _ in pairs)} from step {route.steps[start].key}",
        "kwargsrepr": "{}",
    }
    return celery_app().signature(
        batch_task_name(route),
        args=(pairs, start),
        immutable=True,
        options={**batch_options(route, start, len(pairs), settings, priority), **shown},
    )


def step_signatures(
    route: Route, message_id: int, token: str, start: int, settings: Settings, priority: int | None = None
) -> list[Any]:
    """The tasks that carry one message through `route` from step `start` on: one per step, or per run
    of fused steps, each with the error callback that records a crashed task, all at the message's
    `priority` (Flower shows it with the task)."""
    app = celery_app()
    errback = app.signature(CHAIN_FAILED_TASK, args=(message_id, token), immutable=False)
    # What Flower shows as the arguments, given (Celery's documented argsrepr) rather than computed by
    # Celery's saferepr for every task published: that was a tenth of publishing a chain.
    shown = {"argsrepr": repr((message_id, token)), "kwargsrepr": "{}"}
    return [
        app.signature(
            task_name(route, route.steps[index]),
            args=(message_id, token),
            immutable=True,
            options={**task_options(route, index, settings, priority), **shown},
        ).on_error(errback)
        for index in task_starts(route, start)
    ]


def step_chain(
    route: Route, message_id: int, token: str, start: int, settings: Settings, priority: int | None = None
) -> Any:
    """The same tasks as a Celery chain."""
    from celery.canvas import chain

    return chain(*step_signatures(route, message_id, token, start, settings, priority))


# A message's chain as the engine asks for it: route, message id, fencing token, first step, the
# message's trace (a W3C traceparent, or None) and its priority (0-9, higher = sooner; None: the route's).
Chain = tuple[Route, int, str, int, str | None, int | None]
LOOK_AT_MOST = 10_000  # tasks read from the broker's queues to tell a chain waiting there from a lost one


def chains_in(message: dict[str, Any]) -> list[tuple[int, str]]:
    """The (message id, fencing token) pairs a task message, as a kombu virtual transport keeps it in its
    queue, carries: one for a step task, each of a batch task's; none for any other task."""
    name = message.get("headers", {}).get("task") or ""
    if not name.startswith("openhub.") or name.count(".") < 3:  # openhub.<service>.<operation>.<step>
        return []
    try:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        pairs = args[0] if isinstance(args[0], list) else [args]  # a batch task's: (pairs, first step)
        return [(int(message_id), str(token)) for message_id, token in pairs]
    except (KeyError, IndexError, TypeError, ValueError):  # not a task of this hub's making: not a chain
        return []


class Publisher(Protocol):
    """Where the hub hands its work to workers, and asks about them.

    `CeleryPublisher` (the default) publishes to the broker; `openhub.testing.LocalHub`'s hub has a
    local one that keeps the chains in this process for `LocalHub.run`.
    """

    def publish_many(self, chains: Sequence[Chain]) -> set[int]:
        """Publish the chains; the ids of the messages whose chain was taken (a refused one stays due
        in the store and the poller re-drives it)."""
        ...  # pragma: no cover

    def publish_confirmation(self, message_id: int) -> bool:
        """Hand the sending of the message's due confirmations to a task of their own; False when
        there is none to hand it to (the caller sends them at once)."""
        ...  # pragma: no cover

    def restore_orphans(self, dead: Collection[str]) -> int:
        """Hand the deliveries that the dead worker processes held back to their queues; how many."""
        ...  # pragma: no cover

    def broker_marked(self) -> bool | None:
        """Whether the mark the hub keeps in the broker is there; None where it keeps none. Gone, the
        broker lost the tasks it held since the mark was put (restarted empty, flushed), or is new."""
        ...  # pragma: no cover

    def mark_broker(self) -> None:
        """Put the mark in the broker (again)."""
        ...  # pragma: no cover

    def waiting_chains(self, queues: Collection[str | None]) -> set[tuple[int, str]] | None:
        """The (message id, fencing token) of every chain whose task waits in `queues` (None: the default
        queue), or was taken by a worker that has not acknowledged it (where the broker shows that: Redis);
        None where the broker cannot tell."""
        ...  # pragma: no cover

    def ping_workers(self, timeout: float) -> list[str] | None:
        """The workers that answered within `timeout` seconds; None when they cannot be asked."""
        ...  # pragma: no cover


class CeleryPublisher:
    """Publishes to the Celery broker of `celery_app()`, with the time limits and confirmation queue
    `settings` give."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def publish_many(self, chains: Sequence[Chain]) -> set[int]:
        """One producer publishes them all inside kombu's publish batch: on Redis every chain's first
        task message goes out in one pipelined round trip instead of a round trip per chain (other
        transports publish one by one). Each is published in its message's trace (openhub.core.tracing),
        wherever that happens. A refused batch is refused whole: its messages stay due in the store and
        the poller re-drives them.
        """
        if not chains:
            return set()
        # Built before the broker is touched: a malformed chain is the caller's error and raises here,
        # where a broker's refusal below leaves the messages due for the poller.
        app = celery_app()
        single, tasks = batches(chains)
        firsts = [
            (step_signatures(route, message_id, token, start, self.settings, priority), traceparent)
            for route, message_id, token, start, traceparent, priority in single
        ]
        carriers = [batch_signature(task, self.settings) for task in tasks]
        try:
            declared: set[str] = set()

            def declare(signature: Any) -> None:
                # Each queue is declared once per batch, not once per message (kombu's cached
                # declaration still copies and binds the queue on every publish).
                queue = signature.options.get("queue", app.conf.task_default_queue)
                if queue not in declared:
                    producer.maybe_declare(app.amqp.queues[queue])
                    declared.add(queue)

            with app.producer_or_acquire() as producer, producer.batch():
                for (first, *rest), traceparent in firsts:
                    declare(first)
                    # A chain's own apply_async takes its first task's producer from the pool, outside
                    # the batch: sent here, the first task carries the rest as Celery's message protocol does.
                    with continuing(traceparent):  # in the message's trace, even from a poller's tick
                        first.apply_async(producer=producer, chain=rest[::-1] or None, declare=())
                for signature in carriers:  # each message's steps join its own trace when they run
                    declare(signature)
                    signature.apply_async(producer=producer, declare=())
        except Exception as exc:
            log.warning("could not publish %d chain(s), message %s first: %s", len(chains), chains[0][1], exc)
            return set()
        return {chain[1] for chain in chains}

    def publish_confirmation(self, message_id: int) -> bool:
        """`openhub.confirm` on OPENHUB_CONFIRM_QUEUE (`openhub.confirm`; empty: the default queue); a
        refused publish raises, and the poller hands the confirmation over again when it is due."""
        app = celery_app()
        queue = self.settings.confirm_queue or app.conf.task_default_queue
        app.send_task(CONFIRM_TASK, args=[message_id], queue=queue, routing_key=queue)
        return True

    def restore_orphans(self, dead: Collection[str]) -> int:
        """Only the Redis broker (openhub.celery.redisbroker) knows who holds a delivery; elsewhere 0."""
        if not dead:
            return 0
        with celery_app().connection_for_write() as conn:
            restore = getattr(conn.default_channel, "restore_orphans", None)
            return int(restore(dead)) if restore is not None else 0

    def broker_marked(self) -> bool | None:
        """The Redis broker (openhub.celery.redisbroker) and the embedded one (openhub.celery.fsbroker) keep the mark;
        elsewhere None."""
        with celery_app().connection_for_write() as conn:
            has_mark = getattr(conn.default_channel, "has_mark", None)
            return bool(has_mark()) if has_mark is not None else None

    def mark_broker(self) -> None:
        """Where the broker keeps a mark."""
        with celery_app().connection_for_write() as conn:
            put_mark = getattr(conn.default_channel, "put_mark", None)
            if put_mark is not None:
                put_mark()

    def waiting_chains(self, queues: Collection[str | None]) -> set[tuple[int, str]] | None:
        """The Redis and the embedded broker show their queues, up to LOOK_AT_MOST tasks (more: None);
        other brokers cannot be read without taking the tasks (None)."""
        app = celery_app()
        names = {queue or app.conf.task_default_queue for queue in queues}
        with app.connection_for_write() as conn:
            read = getattr(conn.default_channel, "waiting_messages", None)
            waiting = read(names, LOOK_AT_MOST) if read is not None else None
        return None if waiting is None else {chain for message in waiting for chain in chains_in(message)}

    def ping_workers(self, timeout: float) -> list[str] | None:
        """None also when the broker is down, or a transport without broadcast such as the embedded
        filesystem one: "unknown", which callers must not show as "no workers"."""
        try:
            app = celery_app()
            with app.connection_for_write() as conn:
                # One quick connection attempt: Celery's default retries would hold a page for seconds.
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
                replies = app.control.inspect(timeout=timeout, connection=conn).ping() or {}
        except Exception as exc:
            log.info("could not ping the workers: %s", exc)
            return None
        return sorted(replies)
