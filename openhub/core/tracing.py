"""OpenTelemetry traces of messages: one trace per message, across processes and hours (README.md, "Tracing").

What switches it on: `OTEL_TRACES_EXPORTER` set to an exporter (`otlp`, `console`, or both comma-separated).
Unset, empty or `none` (or `OTEL_SDK_DISABLED=true`) it is off, unlike the OpenTelemetry spec whose
default is `otlp`: a hub that nobody pointed at a collector exports nothing. Off, every function here
returns at once and nothing of OpenTelemetry is imported. On, the standard variables configure it:
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_PROTOCOL`
(`http/protobuf`, the default, or `grpc`), `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER[_ARG]`,
`OTEL_BSP_*`, `OTEL_PROPAGATORS`.

The trace context is stored with the message (`messages.traceparent`, W3C): the span of its submit,
the root of a trace of its own, linked (a span link) to the request that brought it (whose incoming
`traceparent` the FastAPI instrumentation honours for the request's own span) or to
`openhub.submit(..., traceparent=)`. Every later span about the message continues it, whoever runs it
and however late: each step's attempt, the confirmation, the chains the poller re-drives (published
under the stored context, so the Celery instrumentation's publish and run spans join it too). HTTP
calls are spans of the httpx instrumentation, which sends `traceparent` to the external system.

What a caller sent stays with the caller: a new trace per message means no source system chooses the
trace another's message is in, nor leaves it unsampled (a `traceparent` flagged `00`); the message's
spans start from the stored context alone, so no caller's baggage or tracestate reaches an external
system, nor, in a batch task, another message's calls; and only `traceparent` is propagated unless
OTEL_PROPAGATORS says otherwise (the SDK's default adds baggage). Every span is redacted
(`openhub.core.redact`: attributes, events, status) before its exporter sees it.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from openhub.core.logs import MessageScope
from openhub.core.model import route_name

if TYPE_CHECKING:
    from openhub.core.context import StepContext


TRACER = "openhub"
# The OpenTelemetry variables a deployment sets for the hub (README.md, "Tracing"); the SDK reads the rest.
STANDARD_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_PROPAGATORS",
)
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _switched_on() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    return bool(exporters - {"", "none"})


ON = _switched_on()
_ready = False
_provider: Any = None  # a tracer provider given by `use_provider` (None: the global one)


def enabled() -> bool:
    """Whether this process traces (decided once, from the environment, when openhub is imported)."""
    return ON


def valid(traceparent: str | None) -> str | None:
    """`traceparent` if it is a W3C trace context of version 00 with non-zero ids, else None."""
    if not traceparent:
        return None
    found = _TRACEPARENT.match(traceparent.strip().lower())
    if found is None or found[1] == _ZERO_TRACE or found[2] == _ZERO_SPAN:
        return None
    return found[0]


def trace_id(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a stored traceparent; None without one."""
    checked = valid(traceparent)
    return checked[3:35] if checked else None


def trace_url(trace: str | None, template: str | None) -> str | None:
    """The link to a trace: OPENHUB_TRACE_URL's template with `{trace_id}` filled in (None: no link)."""
    if not trace or not template:
        return None
    return template.replace("{trace_id}", trace)


# ---- turning it on ---------------------------------------------------------------------------------


def setup(role: str = "openhub") -> bool:
    """Configure tracing for this process (once; later calls do nothing): a tracer provider from the
    OTEL_* variables unless the application set one already, and the Celery and httpx instrumentations.
    `role` names the service when OTEL_SERVICE_NAME does not. False when tracing is off."""
    global _ready
    if not ON:
        return False
    if _ready:
        return True
    _ready = True
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from openhub.core.span_export import exporters, redacting, sampler

    _propagate_trace_context_only()
    if not _provider_set(trace.get_tracer_provider()):
        name = os.environ.get("OTEL_SERVICE_NAME") or role
        provider = TracerProvider(resource=Resource.create({"service.name": name}), sampler=sampler())
        for exporter in exporters():
            provider.add_span_processor(redacting(BatchSpanProcessor(exporter)))
        trace.set_tracer_provider(provider)
    _instrument_libraries()
    return True


def _propagate_trace_context_only() -> None:
    """Unless OTEL_PROPAGATORS names its own, what the hub propagates (into Celery tasks, to external
    systems) is `traceparent` alone: the SDK's default adds W3C baggage, and a source system's
    `baggage: user.id=…,tenant=…` went on to every external system its message called."""
    if os.environ.get("OTEL_PROPAGATORS", "").strip():
        return
    from opentelemetry.propagate import set_global_textmap
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    set_global_textmap(TraceContextTextMapPropagator())


def _provider_set(provider: Any) -> bool:
    from opentelemetry.trace import ProxyTracerProvider

    return not isinstance(provider, ProxyTracerProvider)


def _instrument_libraries() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    if not CeleryInstrumentor().is_instrumented_by_opentelemetry:  # type: ignore[no-untyped-call]
        CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    if not HTTPXClientInstrumentor().is_instrumented_by_opentelemetry:
        HTTPXClientInstrumentor().instrument()


def instrument_app(app: Any) -> None:
    """Trace the ingress app's requests (an incoming `traceparent` is honoured); nothing when off."""
    if not setup("openhub-api"):
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, excluded_urls="healthz,readyz,metrics,admin/", exclude_spans=["receive", "send"]
    )


# ---- spans of a message's life ---------------------------------------------------------------------


def use_provider(provider: Any) -> None:
    """Trace into `provider` (an SDK TracerProvider; tests use one with an in-memory exporter) whatever
    the environment says; None turns tracing back off. The libraries are not instrumented by it."""
    global ON, _ready, _provider
    ON = _ready = provider is not None
    _provider = provider


def _tracer() -> Any:
    from opentelemetry import trace

    setup()
    return trace.get_tracer(TRACER, tracer_provider=_provider)


def _context_of(traceparent: str | None) -> Any:
    """The context to start a span about a message in: the current span when it is already in the
    message's trace (a task of its chain), else the stored one (a poller tick, an operator's request).
    Always a context of that span alone: whatever else the current context holds (a caller's baggage, the
    context a batch task was published in, another message's) does not go on into the message's spans."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    empty = otel_context.Context()
    current = trace.get_current_span()
    stored = valid(traceparent)
    span = current.get_span_context()
    if stored is None or (span.is_valid and f"{span.trace_id:032x}" == stored[3:35]):
        return trace.set_span_in_context(current, empty)
    return TraceContextTextMapPropagator().extract({"traceparent": stored}, context=empty)


def current_traceparent() -> str | None:
    """The current span's context as a W3C traceparent (None when off or outside any span)."""
    if not ON:
        return None
    from opentelemetry import trace

    span = trace.get_current_span().get_span_context()
    return _format(span) if span.is_valid else None


def _format(span: Any) -> str:
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"


def message_attributes(message: Any) -> dict[str, Any]:
    """The attributes that say which message a span is about (a MessageInfo or MessageView)."""
    return {
        "openhub.message.id": message.id,
        "openhub.correlation_id": message.correlation_id,
        "openhub.source_system": message.source_system,
        "openhub.route": message.route,
    }


def submitting(rows: list[dict[str, Any]]) -> ContextManager[Callable[[list[int | None]], None]]:
    """Spans of the submit of new message rows: each row's `traceparent` (the caller's, when it gave
    one) becomes its submit span's, stored with it. Yields what to call with the stored ids."""
    if not ON:
        return _OFF_SUBMIT
    return _submitting(rows)


@contextmanager
def _submitting(rows: list[dict[str, Any]]) -> Iterator[Callable[[list[int | None]], None]]:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = _tracer()
    spans = []
    for row in rows:
        # A trace of the message's own, linked to its caller's: the caller neither chooses the trace (nor
        # joins another system's) nor decides by its sampled flag whether the message is traced.
        caller = valid(row.get("traceparent"))
        links = []
        if caller:
            remote = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": caller}))
            links.append(trace.Link(remote.get_span_context(), {"openhub.link": "caller"}))
        route = route_name(row["service"], row["operation"])
        span = tracer.start_span(
            f"submit {route}",
            context=otel_context.Context(),
            links=links,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "openhub.route": route,
                "openhub.correlation_id": row["correlation_id"],
                "openhub.source_system": row["source_system"],
            },
        )
        row["traceparent"] = _format(span.get_span_context())
        spans.append(span)

    def stored(ids: list[int | None]) -> None:
        for span, message_id in zip(spans, ids):
            if message_id is None:
                span.set_attribute("openhub.duplicate", True)
            else:
                span.set_attribute("openhub.message.id", message_id)

    try:
        yield stored
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        for span in spans:
            span.end()


def _ignore(ids: list[int | None]) -> None:
    return None


_OFF_SUBMIT: ContextManager[Callable[[list[int | None]], None]] = nullcontext(_ignore)


_NOT_TRACED: ContextManager[None] = nullcontext()


def continuing(traceparent: str | None) -> ContextManager[Any]:
    """Run the block in the message's trace (publishing its chain: the Celery instrumentation's
    spans then join it, wherever the publish happens), and in nothing else of the current context."""
    if not ON:
        return _NOT_TRACED
    return _attached(_context_of(traceparent))


@contextmanager
def _attached(context: Any) -> Iterator[None]:
    if context is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


class StepSpan:
    """The span of one attempt of one step (what `step_span` yields): `ended` notes how it ended."""

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def ended(self, outcome: str | None, code: str | None = None, error: str | None = None) -> None:
        """The step's outcome (None: it succeeded), its error code and error line."""
        if self.span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("openhub.outcome", outcome or "ok")
        if code:
            self.span.set_attribute("openhub.error_code", code)
        if outcome in ("transient", "rejected"):
            self.span.set_status(Status(StatusCode.ERROR, error or code or outcome))


_OFF_STEP = StepSpan()


def _about_message(message: Any, traceparent: str | None, yields: Any) -> MessageScope:
    """The log records' message ids (openhub.core.logs) for the block; all there is of tracing when it is off."""
    return MessageScope(message.id, message.correlation_id, traceparent[3:35] if traceparent else None, yields)


def step_span(route: str, step: str, ctx: StepContext, traceparent: str | None) -> ContextManager[StepSpan]:
    """The span around one attempt of a step, in its message's trace; HTTP calls made in it are its
    children, and log records made in it carry the message's ids."""
    if not ON:
        return _about_message(ctx.message, traceparent, _OFF_STEP)
    return _step_span(route, step, ctx, traceparent)


@contextmanager
def _step_span(route: str, step: str, ctx: StepContext, traceparent: str | None) -> Iterator[StepSpan]:
    attributes = {
        **message_attributes(ctx.message),
        "openhub.step": step,
        "openhub.attempt": ctx.attempt,
        "openhub.message.failed_count": ctx.message.failed_count,
        "openhub.redelivered": ctx.redelivered,
    }
    # Attached, not only given as the parent: what runs in the span (an HTTP call injecting its context)
    # sees the message's context alone, not the one the task was published in (openhub.core.tracing docstring).
    with (
        _about_message(ctx.message, traceparent, None),
        _attached(_context_of(traceparent)),
        _tracer().start_as_current_span(f"step {route}/{step}", attributes=attributes, record_exception=True) as span,
    ):
        yield StepSpan(span)


def message_span(name: str, message: Any, traceparent: str | None, **attributes: Any) -> ContextManager[Any]:
    """A span about a message (its confirmation, a hook's notification) in its trace; None when off.
    Log records made in it carry the message's ids."""
    if not ON:
        return _about_message(message, traceparent, None)
    return _message_span(name, message, traceparent, attributes)


@contextmanager
def _message_span(name: str, message: Any, traceparent: str | None, attributes: dict[str, Any]) -> Iterator[Any]:
    attrs = {**message_attributes(message), **{f"openhub.{k}": v for k, v in attributes.items() if v is not None}}
    with (
        _about_message(message, traceparent, None),
        _attached(_context_of(traceparent)),
        _tracer().start_as_current_span(name, attributes=attrs) as span,
    ):
        yield span


def failed(span: Any, error: str | None) -> None:
    """Mark a span from `message_span` failed."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, error))


def flush(timeout_millis: int = 5000) -> None:
    """Export what this process's spans are still holding (before a short-lived command exits)."""
    if not ON or not _ready:
        return
    from opentelemetry import trace

    flush_spans = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush_spans is not None:
        flush_spans(timeout_millis)
