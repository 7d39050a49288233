"""An agent's process with Pydantic AI's own OpenTelemetry instrumentation, for
tests/test_adapter_tracing.py: ``python -m tests.support.adapter_tracing URL SESSION TENANT
PROMPT`` sets up a provider exporting to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the agent's process
owns it, as an application that traces does: set globally, so our client's spans record in it
too), runs the notes agent of tests/support/adapter_pydantic_ai.py through ``run``, traced by
Pydantic AI into that provider (its ``Instrumentation`` capability with
``InstrumentationSettings(tracer_provider=...)``: Pydantic AI 2 has no ``Agent(instrument=)``),
sends what the provider holds, and prints ``{"status", "pending"}`` as JSON. Workers import
this module with ``--handlers``: it imports the staged tools' module, which registers them."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic_ai import Agent, InstrumentationSettings
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.function import FunctionModel

from pending_actions import AsyncPendingActions
from pending_actions.adapters.pydantic_ai import run
from tests.support.adapter_pydantic_ai import script, write_note

SERVICE = "agent"


def instrumented(provider: TracerProvider) -> Agent[None, str]:
    """The notes agent (its offline model, its staged ``write_note``), traced by Pydantic AI
    into ``provider``."""
    settings = InstrumentationSettings(tracer_provider=provider)
    return Agent(FunctionModel(script), name="notes", tools=[write_note],
                 capabilities=[Instrumentation(settings)])


async def _run(url: str, session: str, tenant: str, prompt: str) -> dict[str, Any]:
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    try:
        async with AsyncPendingActions.from_url(url) as pa:
            got = await run(instrumented(provider), prompt, session=session, tenant=tenant,
                            pa=pa)
    finally:
        provider.shutdown()  # sends what it holds
    return {"status": got.status, "pending": got.pending}


def main(argv: list[str]) -> None:
    url, session, tenant, prompt = argv
    print(json.dumps(asyncio.run(_run(url, session, tenant, prompt))))


if __name__ == "__main__":
    main(sys.argv[1:])
