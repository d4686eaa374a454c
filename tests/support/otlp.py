"""An OTLP/HTTP trace receiver on loopback: what the hub's processes export, decoded with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from email.message import Message
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.stubs import PostStub


@dataclass(frozen=True)
class Span:
    """One exported span, as the receiver decoded it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each linked span
    events: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, attributes) of each event

    def texts(self) -> str:
        """Every text the span carries (name, attributes, status, events), for a search."""
        return repr((self.name, self.attributes, self.status_message, self.events))


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


class Receiver(PostStub):
    """Accepts POST /v1/traces (application/x-protobuf) and keeps every span."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        super().__init__("otlp-receiver")
        self.endpoint = self.url

    def received(self, path: str, headers: Message, body: bytes) -> tuple[int, str | None, bytes]:
        if headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self._take(ExportTraceServiceRequest.FromString(body))
        return 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString()

    def _take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(
                        Span(
                            service=str(resource.get("service.name")),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            status=s.status.code,
                            status_message=s.status.message,
                            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                            events=tuple((e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events),
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(found)

    def trace(self, trace_id: str) -> list[Span]:
        """The spans of one trace received so far."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]
