"""An agent's process, for the tracing tests: one turn, one call of our client, in a process of
its own (``python -m tests.support.agent URL MODE OP JSON``), as a stage and its resolve
usually are. Prints ``{"value", "trace_id", "span_id"}`` (the turn's span) as JSON; a refused
stage's value is ``{"error"}``.

MODE: ``traced`` (the agent owns a provider exporting to ``OTEL_EXPORTER_OTLP_ENDPOINT``, as
an agent framework sets one up, and runs the call inside its span ``agent.turn``),
``untraced`` (OpenTelemetry installed, no provider, no span) or ``absent`` (importing
OpenTelemetry fails, as without the extra)."""

from __future__ import annotations

import sys
from typing import Any

import orjson


def main(url: str, mode: str, op: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import now fails
    from pending_actions.broker import tracing
    from pending_actions.broker.errors import PendingActionsError
    from pending_actions.producers import PendingActions

    pa = PendingActions.from_url(url)

    def call() -> Any:
        if op == "set_policy":
            return pa.set_policy(**kwargs)
        if op == "stage":
            try:
                return pa.stage(**kwargs)
            except PendingActionsError as exc:  # refused (Denied): what the model would read
                return {"error": str(exc)}
        result = pa.resolve(**kwargs)
        return {"text": result.text, "is_error": result.is_error}

    if mode != "traced":
        return {"value": call(), "available": tracing.AVAILABLE}
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    with trace.get_tracer("agent").start_as_current_span("agent.turn") as turn:
        value = call()
    provider.shutdown()  # sends what it holds
    context = turn.get_span_context()
    return {"value": value, "trace_id": f"{context.trace_id:032x}",
            "span_id": f"{context.span_id:016x}"}


if __name__ == "__main__":
    url, mode, op, raw = sys.argv[1:5]
    sys.stdout.write(orjson.dumps(main(url, mode, op, orjson.loads(raw))).decode())
