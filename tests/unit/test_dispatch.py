"""Step options map onto Celery task options (queue, priority, soft and hard time limits); chains go
to the publisher of the hub installed."""

from __future__ import annotations

from datetime import timedelta

import pytest

from openhub import Route, step
from openhub.celery import dispatch
from openhub.celery.dispatch import HARD_LIMIT_MARGIN, CeleryPublisher, task_options, task_starts
from openhub.core.config import get_settings
from openhub.core.registry import Registry
from openhub.engine.hub import Hub, current, install
from openhub.testing import LocalPublisher


@step(timeout=timedelta(seconds=30), queue="mno")
def activate(ctx):
    pass


@step
def plain(ctx):
    pass


@step(timeout=timedelta(seconds=5))
def quick(ctx):
    pass


def test_step_timeout_queue_and_route_priority() -> None:
    route = Route("customer.set", steps=[activate, plain], priority=7, queue="crm")
    assert task_options(route, 0, get_settings()) == {
        "soft_time_limit": 30.0,
        "time_limit": 30.0 + HARD_LIMIT_MARGIN,
        "queue": "mno",
        "priority": 7,
    }
    # A step without its own queue or timeout takes the route's queue and the default timeout.
    options = task_options(route, 1, get_settings())
    assert options["queue"] == "crm"
    assert options["soft_time_limit"] == get_settings().step_timeout.total_seconds()


def test_priority_is_one_direction_higher_sooner_mapped_for_each_broker() -> None:
    from dataclasses import replace

    route = Route("customer.set", steps=[plain])
    settings = get_settings()
    assert task_options(route, 0, settings)["priority"] == settings.default_priority == 4  # no route priority
    assert task_options(route, 0, settings, 9)["priority"] == 9  # the message's own
    rabbit = replace(settings, broker_url="amqp://guest:guest@127.0.0.1:5672//")
    redis = replace(settings, broker_url="redis://127.0.0.1:6379/0")
    assert rabbit.broker == "amqp" and task_options(route, 0, rabbit, 9)["priority"] == 9  # x-max-priority: high first
    # kombu's Redis takes its priority-0 list first: the hub's 9 is Redis's 0.
    assert redis.broker == "redis" and task_options(route, 0, redis, 9)["priority"] == 0
    assert task_options(route, 0, redis, 0)["priority"] == 9


def test_no_queue_means_the_default_queue() -> None:
    assert "queue" not in task_options(Route("customer.set", steps=[plain]), 0, get_settings())


def test_a_fused_route_runs_the_steps_of_one_queue_in_one_task() -> None:
    chained = Route("customer.set", steps=[plain, quick, activate, step(plain.fn, key="again")])
    assert task_starts(chained) == [0, 1, 2, 3]
    fused = Route("customer.set", steps=chained.steps, fused=True)
    # plain and quick share the default queue, activate goes to "mno", the last step back to the default.
    assert task_starts(fused) == [0, 2, 3]
    assert task_starts(fused, 1) == [1, 2, 3]  # resuming inside a run of fused steps starts a task there
    # The task may take all its steps' time; each step keeps its own limit inside it.
    default = get_settings().step_timeout.total_seconds()
    assert task_options(fused, 0, get_settings())["soft_time_limit"] == default + 5.0
    assert task_options(fused, 1, get_settings())["soft_time_limit"] == 5.0


def test_a_hub_installed_publishes_through_its_publisher_and_is_removed_after_the_block() -> None:
    route = Route("customer.set", steps=[plain])
    outer, inner = LocalPublisher(), LocalPublisher()
    with install(Hub(get_settings(), Registry(), outer)):
        assert current().publisher.publish_many([(route, 1, "token-1", 0, "00-trace-01", 4)]) == {1}
        with pytest.raises(RuntimeError), install(Hub(get_settings(), Registry(), inner)):
            assert current().publisher.publish_many([(route, 2, "token-2", 0, None, None)]) == {2}
            raise RuntimeError("the block fails")
        assert current().publisher is outer
        assert outer.publish_confirmation(1) is False and outer.ping_workers(0.5) is None
    assert isinstance(current().publisher, CeleryPublisher)
    assert list(outer.chains) == [(route, 1, "token-1", 0, "00-trace-01", 4)]  # the trace travels with it
    assert list(inner.chains) == [(route, 2, "token-2", 0, None, None)]


def test_a_malformed_chain_is_the_callers_error_not_a_broker_refusal() -> None:
    """publish_many refused a whole batch in silence when one chain could not even be built (the broker
    was never asked): the messages stayed due and the poller re-drove the same error every tick."""
    route = Route("customer.set", steps=[plain])
    publisher = CeleryPublisher(get_settings())
    with pytest.raises(ValueError, match="has no step 5"):
        publisher.publish_many([(route, 1, "token-1", 5, None, None)])


def test_batch_routes_group_their_chains_by_first_step_in_tasks_of_up_to_n_messages() -> None:
    batched = Route("customer.batch", steps=[plain, quick], batch=2)
    chained = Route("customer.set", steps=[plain])
    chains = [
        (batched, 1, "t1", 0, None, 4),
        (chained, 2, "t2", 0, None, 4),
        (batched, 3, "t3", 0, None, 4),
        (batched, 4, "t4", 1, None, 4),
        (batched, 5, "t5", 0, "00-trace-01", 4),
        (batched, 6, "t6", 0, None, 8),
    ]
    single, tasks = dispatch.batches(chains)
    assert single == [(chained, 2, "t2", 0, None, 4)]
    # A batch holds one priority; the higher priority's batches go first.
    assert tasks == [
        (batched, 0, [(6, "t6")], 8),
        (batched, 0, [(1, "t1"), (3, "t3")], 4),
        (batched, 0, [(5, "t5")], 4),
        (batched, 1, [(4, "t4")], 4),
    ]
    # A batch task carries its messages to the route's end, one after another under prefork: its limit
    # is the route's steps' once per message.
    assert task_starts(batched) == [0] and task_starts(batched, 1) == [1]
    default = get_settings().step_timeout.total_seconds()
    options = dispatch.batch_options(batched, 0, 2, get_settings())
    assert options["soft_time_limit"] == 2 * (default + 5.0)
    assert options["time_limit"] == options["soft_time_limit"] + HARD_LIMIT_MARGIN
    assert dispatch.batch_task_name(batched) == "openhub.customer.batch.batch"


def test_a_worker_refuses_routes_whose_task_may_outlast_rabbitmqs_consumer_timeout() -> None:
    # RabbitMQ takes a delivery back (closing the worker's channel) after consumer_timeout, as Redis hands
    # it to another worker after the visibility timeout: a step that may run longer is refused at start.
    from dataclasses import replace

    from celery import Celery

    from openhub.core.errors import ConfigurationError
    from tasks.steps import register_step_tasks

    settings = replace(
        get_settings(),
        broker_url="amqp://guest:guest@127.0.0.1:5672//",
        routes=("tests.support.routes",),
        step_timeout=timedelta(seconds=20),
        consumer_timeout=timedelta(seconds=15),
    )
    with pytest.raises(ConfigurationError, match="consumer_timeout.*OPENHUB_CONSUMER_TIMEOUT"):
        register_step_tasks(Celery("refused"), Hub.build(settings))
    # A batch route's task runs its messages one after another: 20 messages x their steps must fit too.
    with pytest.raises(ConfigurationError, match=r"openhub.batched.\w+.batch may run \d+ s \(20 messages"):
        register_step_tasks(Celery("refused"), Hub.build(replace(settings, consumer_timeout=timedelta(seconds=300))))
    register_step_tasks(Celery("taken"), Hub.build(replace(settings, consumer_timeout=timedelta(minutes=30))))
