"""An OTLP/HTTP trace receiver in the test process: what the SDK's own exporter sends
(``POST /v1/traces``, a protobuf ``ExportTraceServiceRequest``, gzip or not), decoded with
opentelemetry-proto into plain ``Span`` records the tests can wait on."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status: int = 0  # 2: ERROR
    start_ns: int = 0
    end_ns: int = 0


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in items}


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                out.append(Span(
                    s.name, service, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                    _attributes(s.attributes),
                    [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                    [(e.name, _attributes(e.attributes)) for e in s.events],
                    s.status.code, s.start_time_unix_nano, s.end_time_unix_nano))
    return out


class Receiver:
    """Collects every span exported to ``endpoint``."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                spans = decode(body) if self.path == "/v1/traces" else []
                with receiver.changed:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver.changed.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def env(self, service: str) -> dict[str, str]:
        """The standard variables a process exports to this receiver with, promptly."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_SERVICE_NAME": service,
                "OTEL_BSP_SCHEDULE_DELAY": "50"}

    def wait(self, match: Callable[[Span], bool], count: int = 1,
             timeout: float = 20.0) -> list[Span]:
        """The first ``count`` spans that match, once they have all come."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = [s for s in self.spans if match(s)]
                if len(found) >= count:
                    return found[:count]
                left = deadline - time.monotonic()
                assert left > 0, (f"{len(found)} of {count} matching spans within {timeout}s; "
                                  f"got {[(s.name, s.attributes) for s in self.spans]}")
                self.changed.wait(left)

    def one(self, name: str, **attributes: Any) -> Span:
        """The one span named ``name`` with these ``pending_actions.*`` attributes, waited for."""
        want = {f"pending_actions.{k}": v for k, v in attributes.items()}
        [span] = self.wait(lambda s: s.name == name and all(
            s.attributes.get(k) == v for k, v in want.items()))
        return span


@contextmanager
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
