"""One OpenTelemetry trace per message (openhub/core/tracing.py), issue 23.

Real processes: `openhub serve`, a `celery -A tasks worker` and a `celery -A tasks beat` on Redis and
PostgreSQL export to an OTLP/HTTP receiver on loopback (tests/support/otlp.py). A three-step route whose
second step fails once (re-driven by the poller) must give one trace from the request: a span per step
attempt and per external call, the traceparent each external call carried, the confirmation, no orphan.
Then the span shape at unit level (LocalHub and the SDK's in-memory exporter), and nothing exported
with tracing off.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from openhub import list_messages
from openhub.core import tracing
from openhub.testing import ExternalSystem, LocalHub
from tests.support import backends
from tests.support.otlp import Receiver, Span
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import PROJECT, Beat, Worker

OPENHUB = str(Path(sys.executable).with_name("openhub"))
KEY = "shop-" + secrets.token_hex(20)
ADMIN = "admin-" + secrets.token_hex(20)
ROUTES = "tests.support.traced_routes"
STEPS = ("reserve", "charge", "ship")
SERVER, CLIENT = 2, 3  # OTLP span kinds


class Hub:
    """The hub's processes on one backend, exporting to `receiver` when `traced`."""

    def __init__(
        self,
        backend: backends.Backend,
        external: ExternalSystem,
        receiver: Receiver,
        traced: bool,
        log_format: str = "text",
    ) -> None:
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_TRACES_EXPORTER": "otlp" if traced else "none",
        }
        self.env = {
            **backend.env,
            **otel,
            "OPENHUB_TEST_HTTP_URL": external.url,
            "OPENHUB_API_KEYS": f"SHOP={KEY}",
            "OPENHUB_ADMIN_TOKEN": ADMIN,
            "OPENHUB_TRACE_URL": "https://traces.example/trace/{trace_id}",
            "OPENHUB_LOG_FORMAT": log_format,
        }
        workdir = backend.workdir
        self.worker = Worker(self.env, workdir, beat=False, concurrency=2)
        self.beat = Beat(self.env, workdir)
        self.port = backends.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.serve: subprocess.Popen | None = None

    def start(self) -> "Hub":
        self.worker.start()
        self.beat.start()
        self.serve = subprocess.Popen(
            [OPENHUB, "serve", "--port", str(self.port)],
            env=dict(os.environ, **self.env, PYTHONPATH=str(PROJECT)),
            cwd=PROJECT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def up() -> bool:
            assert self.serve is not None and self.serve.poll() is None, "openhub serve exited"
            try:
                return httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "openhub serve to answer /healthz")
        return self

    def stop(self) -> None:
        if self.serve is not None and self.serve.poll() is None:
            os.killpg(self.serve.pid, signal.SIGTERM)
            self.serve.wait(timeout=30)
        self.beat.stop()
        self.worker.stop()

    def submit(self, payload: Any, headers: dict[str, str] | None = None) -> int:
        r = httpx.post(
            f"{self.base}/api/v1/messages/trace/order",
            json=payload,
            timeout=10,
            headers={"Authorization": f"Bearer {KEY}", "X-Correlation-Id": uuid.uuid4().hex, **(headers or {})},
        )
        assert r.status_code == 202, r.text
        return r.json()["id"]

    def message(self, message_id: int) -> dict[str, Any]:
        r = httpx.get(
            f"{self.base}/api/v1/messages/{message_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        )
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def external(monkeypatch: pytest.MonkeyPatch) -> Iterator[ExternalSystem]:
    system = ExternalSystem().start()
    monkeypatch.setenv("OPENHUB_TEST_HTTP_URL", system.url)
    yield system
    system.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[backends.Backend]:
    with backends.backend("redis-pg", tmp_path, extra={"OPENHUB_ROUTES": ROUTES}) as b:
        yield b


def _orphans(spans: list[Span]) -> list[Span]:
    ids = {s.span_id for s in spans}
    return [s for s in spans if s.parent_id and s.parent_id not in ids]


def _whole(spans: list[Span], external: ExternalSystem) -> bool:
    """The message's life is all there: its submit, four step attempts, every call, the confirmation,
    and every span's parent (a parent ends after its children, so it may still be on its way)."""
    names = Counter(s.name for s in spans)
    return (
        names["submit trace.order"] == 1
        and names["confirm SHOP"] == 1
        and sum(1 for s in spans if s.kind == CLIENT) == len(external.calls) == 5
        and sum(n for name, n in names.items() if name.startswith("step ")) == 4
        and not _orphans(spans)
    )


def test_one_trace_from_the_request_through_a_retry_to_the_confirmation(backend, external, receiver) -> None:
    external.fail("/charge", times=1)  # the second step's first attempt fails; the poller re-drives it
    hub = Hub(backend, external, receiver, traced=True).start()
    try:
        message_id = hub.submit({"order": 1})
        assert wait_final(message_id, timeout=60).state == "OK"
        detail = hub.message(message_id)
        trace_id = detail["trace_id"]
        assert trace_id and len(trace_id) == 32
        assert detail["trace_url"] == f"https://traces.example/trace/{trace_id}"
        spans = wait_for(
            lambda: _whole(receiver.trace(trace_id), external) and receiver.trace(trace_id),
            60,
            "the message's whole trace",
        )
    finally:
        hub.stop()
    # One root: the message's submit, in the API process, linked to the request that brought it in (the
    # request's own span is in the caller's trace: issue 34 L4).
    roots = [s for s in spans if not s.parent_id]
    submit = next(s for s in spans if s.name == "submit trace.order")
    assert roots == [submit] and submit.service == "openhub-api"
    assert {s.service for s in spans} == {"openhub-api", "openhub-worker"}
    assert submit.attributes["openhub.message.id"] == message_id
    (linked,) = submit.links
    request = wait_for(
        lambda: next((s for s in receiver.spans if (s.trace_id, s.span_id) == linked), None), 30, "the request's span"
    )
    assert request.kind == SERVER and request.trace_id != trace_id
    # A span per step attempt, each with what it was about and how it ended.
    steps = sorted(
        (s for s in spans if s.name.startswith("step ")),
        key=lambda s: (STEPS.index(s.attributes["openhub.step"]), s.attributes["openhub.attempt"]),
    )
    assert [
        (s.attributes["openhub.step"], s.attributes["openhub.attempt"], s.attributes["openhub.outcome"]) for s in steps
    ] == [("reserve", 1, "ok"), ("charge", 1, "transient"), ("charge", 2, "ok"), ("ship", 1, "ok")]
    assert steps[1].attributes["openhub.error_code"] == "HTTP_503" and steps[1].status == 2
    for s in steps:
        assert s.attributes["openhub.message.id"] == message_id
        assert s.attributes["openhub.route"] == "trace.order" and s.attributes["openhub.source_system"] == "SHOP"
        assert s.attributes["openhub.correlation_id"] == detail["correlation_id"]
    # Every external call carried the trace, each with its own client span as parent.
    clients = {s.span_id: s for s in spans if s.kind == CLIENT}
    by_step = {s.span_id: s for s in steps}
    for call in external.calls:
        version, call_trace, parent, _flags = call.headers["traceparent"].split("-")
        assert call_trace == trace_id and parent in clients, call
        if call.path != "/confirm":
            assert clients[parent].parent_id in by_step
            assert by_step[clients[parent].parent_id].attributes["openhub.step"] == call.path.strip("/")
    # The confirmation is in the same trace, and its call is its child.
    confirm = next(s for s in spans if s.name == "confirm SHOP")
    assert confirm.attributes["openhub.outcome"] == "OK" and confirm.attributes["openhub.message.id"] == message_id
    confirm_call = next(c for c in external.calls if c.path == "/confirm")
    assert clients[confirm_call.headers["traceparent"].split("-")[2]].parent_id == confirm.span_id
    # The poller's re-drive published the retry's chain in the message's trace (its tick traces nothing):
    # the first task published twice, by the request and by the poller, both under the message's submit.
    publishes = [s for s in spans if s.name == "apply_async/openhub.trace.order.reserve"]
    assert [p.service for p in publishes] == ["openhub-api", "openhub-worker"], publishes
    assert publishes[1].parent_id == submit.span_id
    assert not any("openhub.poll" in s.name for s in receiver.spans)
    assert _orphans(spans) == []


def _json_lines(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def test_a_callers_trace_is_linked_not_joined_and_its_context_goes_no_further(backend, external, receiver) -> None:
    """Issue 34 L4/M3: the caller chose the trace id (one system could join another's trace), a `00`
    sampled flag left the message untraced, and its baggage and tracestate reached every external system."""
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    external.fail("/confirm", times=1)  # logged as a warning about the message, then retried
    hub = Hub(backend, external, receiver, traced=True, log_format="json").start()
    try:
        message_id = hub.submit(
            {"order": 2},
            headers={
                "traceparent": f"00-{caller_trace}-{caller_span}-00",
                "tracestate": "vendor=forged",
                "baggage": "user.id=42,forged.tenant=CRM",
            },
        )
        assert wait_final(message_id, timeout=60).state == "OK"
        detail = hub.message(message_id)
        trace_id = detail["trace_id"]
        assert trace_id and trace_id != caller_trace
        submit = wait_for(
            lambda: next((s for s in receiver.trace(trace_id) if s.name == "submit trace.order"), None),
            30,
            "the message's submit span (traced although the caller's flag said 00)",
        )
        wait_for(lambda: external.count("/confirm", 200) == 1, 30, "the confirmation's second attempt")
    finally:
        hub.stop()
    assert not submit.parent_id and [t for t, _span in submit.links] == [caller_trace]
    assert receiver.trace(caller_trace) == []  # the caller's unsampled trace: the request span not exported
    assert {c.headers["traceparent"].split("-")[1] for c in external.calls} == {trace_id}
    assert not [c.headers for c in external.calls if {"baggage", "tracestate"} & set(c.headers)]
    # The worker's JSON log line about the failed confirmation joins the message's trace.
    failed = [x for x in _json_lines(hub.worker.log()) if "confirmation to SHOP" in x["message"]]
    assert failed and failed[0]["level"] == "WARNING", hub.worker.log()[-3000:]
    assert (failed[0]["message_id"], failed[0]["correlation_id"], failed[0]["trace_id"]) == (
        message_id,
        detail["correlation_id"],
        trace_id,
    )


def test_with_tracing_off_nothing_is_exported(backend, external, receiver) -> None:
    external.fail("/confirm", times=1)
    hub = Hub(backend, external, receiver, traced=False).start()
    try:
        message_id = hub.submit({"order": 3})
        assert wait_final(message_id, timeout=60).state == "OK"
        detail = hub.message(message_id)
        wait_for(lambda: external.count("/confirm", 200) == 1, 30, "the confirmation's second attempt")
    finally:
        hub.stop()  # a process holding spans would export them at exit
    assert detail["trace_id"] is None and detail["trace_url"] is None
    assert receiver.requests == 0 and receiver.spans == []
    assert not any("traceparent" in c.headers for c in external.calls)
    # Lines about the message still say which one (text format, no trace).
    assert f"[message {message_id} {detail['correlation_id']}]" in hub.worker.log()


# ---- span shape at unit level: LocalHub in this process, the SDK's in-memory exporter -----------------


@pytest.fixture
def memory() -> Iterator[Any]:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        HTTPXClientInstrumentor().uninstrument()
        tracing.use_provider(None)


def test_span_shape_of_a_message_with_a_retry(memory, external) -> None:
    external.fail("/charge", times=1)
    caller = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    with LocalHub(ROUTES, source_system="SHOP") as hub:
        view = hub.submit("trace.order", {"order": 4}, traceparent=caller)
        hub.run()
        hub.tick(seconds=60)  # the retry
        hub.tick(seconds=120)  # the confirmation, due when the message ended
        assert hub.get(view.id).state == "OK"
        stored = hub.get(view.id).traceparent
    spans = memory.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in spans} == {view.trace_id} != {caller[3:35]}
    submit = next(s for s in spans if s.name == "submit trace.order")
    assert submit.parent is None  # a trace of its own, linked to the caller's span
    assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in submit.links] == [
        (caller[3:35], caller[36:52])
    ]
    assert stored == f"00-{view.trace_id}-{submit.context.span_id:016x}-{int(submit.context.trace_flags):02x}"
    steps = [s for s in spans if s.name.startswith("step trace.order/")]
    assert [
        (
            s.attributes["openhub.step"],
            s.attributes["openhub.attempt"],
            s.attributes["openhub.outcome"],
            s.attributes.get("openhub.error_code"),
        )
        for s in steps
    ] == [
        ("reserve", 1, "ok", None),
        ("charge", 1, "transient", "HTTP_503"),
        ("charge", 2, "ok", None),
        ("ship", 1, "ok", None),
    ]
    # Each step attempt continues the stored trace from its submit span, however late it ran.
    assert {s.parent.span_id for s in steps} == {submit.context.span_id}
    confirm = next(s for s in spans if s.name == "confirm SHOP")
    assert confirm.parent.span_id == submit.context.span_id and confirm.attributes["openhub.outcome"] == "OK"
    calls = [s for s in spans if s.kind.name == "CLIENT"]
    assert len(calls) == len(external.calls) == 5
    assert {c.parent.span_id for c in calls} == {s.context.span_id for s in steps} | {confirm.context.span_id}


def test_a_splits_children_join_their_parents_trace(memory, external) -> None:
    with LocalHub(ROUTES, source_system="SHOP") as hub:
        parent = hub.submit("trace.lines", {"lines": [{"n": 1}, {"n": 2}]})
        hub.run()
        assert hub.get(parent.id).state == "OK"
        children = list_messages(parent_id=parent.id)
    assert len(children) == 2 and {c.traceparent for c in children} == {parent.traceparent}
    books = [s for s in memory.get_finished_spans() if s.name == "step trace.line/book_line"]
    assert len(books) == 2 and {f"{s.context.trace_id:032x}" for s in books} == {parent.trace_id}
    assert {c.headers["traceparent"][3:35] for c in external.calls} == {parent.trace_id}


def test_an_unsampled_caller_leaves_no_message_untraced(memory, external) -> None:
    """Issue 34 L4: under the parent-based sampler a caller's `00` flag left its messages untraced."""
    caller = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
    with LocalHub(ROUTES, source_system="SHOP") as hub:
        view = hub.submit("trace.order", {"order": 5}, traceparent=caller)
        hub.run()
    assert int(view.traceparent[-2:], 16) & 1 and view.trace_id != caller[3:35]  # sampled
    assert {s.name for s in memory.get_finished_spans()} >= {"submit trace.order", "step trace.order/ship"}


def test_no_callers_baggage_reaches_the_calls_of_a_batch(memory, external) -> None:
    """Issue 34 M3: in a `batch=10` route CRM's calls carried SHOP's baggage: a batch task runs in the
    context it was published in, and each message's spans were started in it, baggage and all."""
    from opentelemetry import baggage, context
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagate import get_global_textmap, set_global_textmap
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    before = get_global_textmap()  # the SDK's default, baggage propagated: what a deployment may choose
    set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()]))
    published_in = baggage.set_baggage("forged.tenant", "CRM", baggage.set_baggage("user.id", "42"))
    token = context.attach(published_in)
    try:
        with LocalHub(ROUTES, source_system="SHOP") as hub:
            views = [
                hub.submit("trace.batch", {"n": n}, source_system=system)
                for n, system in enumerate(["SHOP", "CRM", "SHOP"])
            ]
            hub.run()
            assert {hub.get(v.id).state for v in views} == {"OK"}
    finally:
        context.detach(token)
        set_global_textmap(before)
    calls = [c for c in external.calls if c.path == "/ship"]
    assert len(calls) == 3 and not [c.headers for c in calls if "baggage" in c.headers]
    # each call in its own message's trace
    assert sorted(c.headers["traceparent"][3:35] for c in calls) == sorted(v.trace_id for v in views)


def test_tracing_is_off_unless_an_exporter_is_named(tmp_path: Path) -> None:
    # On the embedded default: redis-py 8 itself imports opentelemetry's metrics SDK when it is installed.
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(PROJECT), "OPENHUB_VAR_DIR": str(tmp_path)}
    for value, on in (("", False), ("none", False), ("otlp", True), ("console,otlp", True)):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, openhub, openhub.core.tracing as t, tasks; "
                "print(t.enabled(), any(m.startswith('opentelemetry') for m in sys.modules))",
            ],
            env={**env, "OTEL_TRACES_EXPORTER": value},
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(on), str(on)], (value, out.stdout)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "0af7651916cd43dd8448eb211c80319c"),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
        ("garbage", None),
        ("", None),
        (None, None),
    ],
)
def test_trace_id_of_a_traceparent(value, expected) -> None:
    assert tracing.trace_id(value) == expected


def test_only_the_trace_context_is_propagated_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 M3: the SDK's default propagators (tracecontext,baggage) carried a source system's baggage
    into every Celery task and HTTP call; the hub's default is tracecontext alone, OTEL_PROPAGATORS may say more."""
    from opentelemetry.propagate import get_global_textmap, set_global_textmap

    before = get_global_textmap()
    try:
        monkeypatch.delenv("OTEL_PROPAGATORS", raising=False)
        tracing._propagate_trace_context_only()
        assert get_global_textmap().fields == {"traceparent", "tracestate"}
        set_global_textmap(before)
        monkeypatch.setenv("OTEL_PROPAGATORS", "tracecontext,baggage")
        tracing._propagate_trace_context_only()
        assert get_global_textmap() is before  # the deployment's own choice is left alone
    finally:
        set_global_textmap(before)
