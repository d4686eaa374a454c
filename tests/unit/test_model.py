"""Every malformed declaration fails at load time with ConfigurationError."""

from __future__ import annotations

import sys
import textwrap
from datetime import timedelta

import pytest

from openhub import Child, ConfigurationError, RetryPolicy, Route, Split, step
from openhub.celery.dispatch import task_name
from openhub.core.config import get_settings
from openhub.core.registry import build_registry


@step
def one(ctx):
    pass


@step(key="two")
def other(ctx):
    pass


def plain(ctx):
    pass


def test_step_defaults_to_function_name_and_message_scope() -> None:
    assert one.key == "one" and one.scope == "message" and one.timeout is None


def test_step_options_are_kept() -> None:
    s = step(key="mno", scope="entity", timeout=timedelta(seconds=30), queue="mno")(plain)
    assert (s.key, s.scope, s.timeout, s.queue) == ("mno", "entity", timedelta(seconds=30), "mno")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"retries": 3}, "unknown @step option"),
        ({"scope": "global"}, "scope must be one of"),
        ({"scope": "custom"}, "needs custom_key"),
        ({"custom_key": lambda c: "x"}, "only allowed with scope='custom'"),
        ({"key": "bad key"}, "must be an identifier"),
        ({"timeout": timedelta(0)}, "positive timedelta"),
        ({"timeout": "soon"}, "positive timedelta"),
        ({"retry": 3}, "retry must be a RetryPolicy"),
        ({"queue": 5}, "queue must be a string"),
    ],
)
def test_malformed_step(options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        step(**options)(plain)


@pytest.mark.parametrize(
    "name, steps, options, message",
    [
        ("customer.set", [one], {"retries": 1}, "unknown option"),
        ("customer", [one], {}, "service.operation"),
        ("customer.set", [], {}, "has no steps"),
        ("customer.set", [one, plain], {}, "is not a @step"),
        ("customer.set", [one, one], {}, "duplicate step key"),
        ("customer.set", [one], {"object_id": "externalId"}, "object_id must be a callable"),
        ("customer.set", [one], {"retry": {"max_fails": 1}}, "retry must be a RetryPolicy"),
        ("customer.set", [one], {"priority": 11}, "priority must be an int"),
        ("customer.set", [one], {"guaranteed_order": True}, "needs a funnel"),
        ("customer.set", [one], {"exclude_failed": True}, "needs guaranteed_order"),
        ("customer.set", [one], {"validate": 3}, "validate must be"),
        ("customer.set", [one], {"secret_fields": "card.pin"}, "secret_fields must be"),
        ("customer.set", [one], {"secret_fields": ["card..pin"]}, "secret_fields must be"),
    ],
)
def test_malformed_route(name: str, steps: list, options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Route(name, steps=steps, **options)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_fails": -1}, "max_fails"),
        ({"interval": timedelta(0)}, "interval"),
        ({"backoff": 0.5}, "backoff"),
    ],
)
def test_malformed_retry_policy(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)


def test_retry_policy_backoff_is_capped() -> None:
    policy = RetryPolicy(interval=timedelta(seconds=10), backoff=2, max_interval=timedelta(seconds=30))
    assert [policy.delay(n).total_seconds() for n in (1, 2, 3, 4)] == [10, 20, 30, 30]


def test_route_is_printable_and_names_its_tasks() -> None:
    route = Route("customer.setCustomer", steps=[one, other])
    assert (route.service, route.operation) == ("customer", "setCustomer")
    assert [task_name(route, s) for s in route.steps] == [
        "openhub.customer.setCustomer.one",
        "openhub.customer.setCustomer.two",
    ]
    assert "customer.setCustomer" in repr(route)


def _module(tmp_path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def test_duplicate_route_across_modules(tmp_path, monkeypatch) -> None:
    body = """
        from openhub import Route, step
        @step
        def s(ctx): pass
        routes = [Route("dup.route", steps=[s])]
    """
    a = _module(tmp_path, monkeypatch, "routes_dup_a", body)
    b = _module(tmp_path, monkeypatch, "routes_dup_b", body)
    with pytest.raises(ConfigurationError, match="duplicate route 'dup.route'"):
        build_registry([a, b], get_settings())


def test_split_to_unknown_route(tmp_path, monkeypatch) -> None:
    name = _module(
        tmp_path,
        monkeypatch,
        "routes_split_bad",
        """
        from openhub import Route, Split, Child
        def kids(ctx): return []
        routes = [Route("order.create", steps=[Split(kids, route="order.nothere")])]
    """,
    )
    with pytest.raises(ConfigurationError, match="unknown route 'order.nothere'"):
        build_registry([name], get_settings())


def test_routes_must_hold_routes(tmp_path, monkeypatch) -> None:
    name = _module(tmp_path, monkeypatch, "routes_not_routes", "routes = ['customer.set']\n")
    with pytest.raises(ConfigurationError, match="must hold Route objects"):
        build_registry([name], get_settings())


def test_unimportable_routes_module() -> None:
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        build_registry(["routes_that_do_not_exist"], get_settings())


def test_two_confirmers_for_one_system(tmp_path, monkeypatch) -> None:
    code = (
        "from openhub import confirmation\n\n@confirmation('UNIT-SYS')\ndef first(outcome): pass\n\n"
        "@confirmation('UNIT-SYS')\ndef second(outcome): pass\n"
    )
    name = _module(tmp_path, monkeypatch, "routes_two_confirmers", code)
    with pytest.raises(ConfigurationError, match="two confirmers"):
        build_registry([name], get_settings())


def test_confirmers_belong_to_the_registry_that_loaded_them(tmp_path, monkeypatch) -> None:
    code = "from openhub import confirmation\n\n@confirmation('CRM')\ndef mine(outcome): pass\n"
    one = _module(tmp_path, monkeypatch, "routes_confirm_one", code)
    other = _module(tmp_path, monkeypatch, "routes_confirm_other", code.replace("mine", "theirs"))
    assert build_registry([one], get_settings()).confirmers["CRM"].__name__ == "mine"
    assert build_registry([other], get_settings()).confirmers["CRM"].__name__ == "theirs"  # nothing leaked
    assert "CRM" not in build_registry(["tests.support.promise_routes"], get_settings()).confirmers


def test_split_and_child_are_plain_data() -> None:
    s = Split(lambda ctx: [Child("order.bookLine", {"sku": 1})], key="lines")
    assert s.key == "lines" and s.scope == "message"
    assert Child("a.b", {}).object_id is None


def test_example_routes_load() -> None:
    registry = build_registry(["routes"], get_settings())
    assert "customer.setCustomer" in registry.routes
    assert "CRM" not in registry.confirmers  # no code confirms the CRM: its endpoint's setting does
    from openhub.core.config import Settings

    settings = Settings.from_env(
        {"OPENHUB_CONFIRM_ENDPOINTS": "CRM=http://crm.example/confirm", "OPENHUB_CONFIRM_SECRETS": "CRM=" + "c" * 40}
    )
    stock = build_registry(["routes"], settings).confirmers["CRM"]
    assert stock.endpoint.url == "http://crm.example/confirm"  # type: ignore[attr-defined]


def test_the_routing_model_imports_no_store_broker_or_web_library() -> None:
    import subprocess

    code = (
        "import sys\nfrom openhub import Route, step, Split, Child, confirmation, Outcome, StepContext, Reject\n"
        "print(','.join(m for m in ('sqlalchemy', 'celery', 'fastapi', 'kombu') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_sources_and_responders_are_lists_of_system_names() -> None:
    """Issue 27: who may submit a route's messages and who may answer its callbacks."""
    route = Route("payment.authorize", steps=[one], sources=["SHOP"], responders=["BANK"])
    assert route.sources == ("SHOP",) and route.responders == ("BANK",)
    assert Route("a.b", steps=[one]).sources == () and Route("a.b", steps=[one]).responders == ()
    for bad in ("BANK", [""], [1]):
        with pytest.raises(ConfigurationError, match="responders must be a list of source system names"):
            Route("a.b", steps=[one], responders=bad)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "20"])
def test_batch_must_be_a_whole_number_of_messages(value: object) -> None:
    with pytest.raises(ConfigurationError, match="batch must be a whole number"):
        Route("svc.op", steps=[step(lambda ctx: None, key="a")], batch=value)


def test_a_batch_route_keeps_all_its_steps_on_one_queue() -> None:
    a, b = step(lambda ctx: None, key="a"), step(lambda ctx: None, key="b", queue="slow")
    assert Route("svc.op", steps=[a, step(lambda ctx: None, key="c")], batch=10, queue="q").batch == 10
    with pytest.raises(ConfigurationError, match="step 'b' is on 'slow'"):
        Route("svc.op", steps=[a, b], batch=10)
    assert Route("svc.op", steps=[a, b]).batch is None  # not a batch route: any queues


def test_a_topic_takes_its_own_options_and_subscriptions_name_loaded_topics() -> None:
    from openhub import Topic
    from openhub.core.registry import Registry
    from openhub.core.topics import subscribers

    topic = Topic("order.created", sources=["SHOP"])
    assert [s.key for s in topic.steps] == ["fan_out"] and topic.sources == ("SHOP",)
    with pytest.raises(ConfigurationError, match="topic 'order.created': unknown option"):
        Topic("order.created", steps=[one])
    with pytest.raises(ConfigurationError, match="subscribes must name topics"):
        Route("crm.order", steps=[one], subscribes=["not a name"])
    registry = Registry()
    for route in (
        topic,
        Route("crm.order", steps=[one], subscribes="order.created"),
        Route("billing.order", steps=[one], subscribes=["order.created"]),
        Route("other.route", steps=[one]),
    ):
        registry.add(route, "t")
    registry.check()
    assert [r.name for r in subscribers(registry.routes, "order.created")] == ["billing.order", "crm.order"]
    registry.add(Route("stock.order", steps=[one], subscribes="other.route"), "t")
    with pytest.raises(ConfigurationError, match="subscribes to 'other.route', which is a route, not a Topic"):
        registry.check()
    del registry.routes["stock.order"]
    registry.add(Route("stock.order", steps=[one], subscribes="order.gone"), "t")
    with pytest.raises(ConfigurationError, match="subscribes to 'order.gone', which is unknown"):
        registry.check()
