"""What a tracer provider set up by `openhub.core.tracing.setup` hands its spans to: the exporters
OTEL_TRACES_EXPORTER names, a sampler that starts no trace for the poller's tick, and a processor that
redacts every ended span before an exporter sees it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("openhub.tracing")

POLL_TICKS = frozenset({"apply_async/openhub.poll", "run/openhub.poll"})  # one a second: never sampled


# Attributes the hub sets itself, identifiers it shows anyway: not passed through the redaction's shape test.
KEPT_ATTRIBUTES = (
    "openhub.message.id",
    "openhub.correlation_id",
    "openhub.source_system",
    "openhub.route",
    "openhub.step",
    "openhub.attempt",
    "openhub.outcome",
    "openhub.error_code",
    "openhub.hook",
)


def redacting(processor: Any) -> Any:
    """`processor` (a span processor) given each ended span with its attributes, events' attributes, links'
    attributes and status description redacted (`openhub.core.redact`): a client span's `http.url` with an
    `?api_key=`, an exception event's echoed body, a status with a token. Runs where the span ends (in the
    step, where the values it sent as secrets are known)."""
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.trace import Link, Status

    from openhub.core.redact import redact_mapping, redact_text

    def clean(span: ReadableSpan) -> ReadableSpan:
        status = span.status
        if status.description:
            status = Status(status.status_code, redact_text(status.description))
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=redact_mapping(span.attributes or {}, KEPT_ATTRIBUTES),
            events=[Event(e.name, redact_mapping(e.attributes or {}), e.timestamp) for e in span.events],
            links=[Link(link.context, redact_mapping(link.attributes or {})) for link in span.links],
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class Redacting(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            processor.on_start(span, parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            processor.on_end(clean(span))

        def shutdown(self) -> None:
            processor.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(processor.force_flush(timeout_millis))

    return Redacting()


def sampler() -> Any:
    """The sampler OTEL_TRACES_SAMPLER names (parent-based always-on by default), except that the
    poller's tick, beat's once a second, starts no trace of its own: what a tick does for a message
    joins that message's trace."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult, _get_from_env_or_default

    configured = _get_from_env_or_default()

    class SkipPollTicks(Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any) -> Any:
            if name in POLL_TICKS:
                return SamplingResult(Decision.DROP)
            return configured.should_sample(parent_context, trace_id, name, *args, **kwargs)

        def get_description(self) -> str:
            return f"SkipPollTicks{{{configured.get_description()}}}"

    return SkipPollTicks()


def exporters() -> list[Any]:
    names = [e.strip().lower() for e in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    found: list[Any] = []
    for name in names:
        if name == "otlp":
            protocol = (
                os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

                found.append(Grpc())
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

                found.append(Http())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            found.append(ConsoleSpanExporter())
        elif name not in ("", "none"):
            log.warning("OTEL_TRACES_EXPORTER names %r, which openhub does not know (otlp, console): ignored", name)
    return found
