"""CONTRACT sections 8 (Tracing) and 9: a staged tool's call made inside Pydantic AI's own
OpenTelemetry instrumentation joins the agent framework's trace. The adapter stages a paused
call in the context the call was decided in (``Running.decide`` keeps it, ``_staged_call``
stages in it), so the stage carries Pydantic AI's tool span through Redis and the worker's
``pending_actions.apply`` span, in the trace of the person's resolve, links into the agent
run's trace.

Real parts: an OTLP/HTTP receiver in this process (tests/support/otlp.py); the agent in a
process of its own (tests/support/adapter_tracing.py: a global provider exporting OTLP, the
agent instrumented with it); a worker started through the CLI exporting from the standard
OTEL_* variables; the person's resolve from this process, inside a span of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from pending_actions import PendingActions
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT, child_env
from tests.support.adapter_pydantic_ai import notes, prompt
from tests.support.faults import FAST
from tests.support.otlp import Receiver, Span, receiver
from tests.support.procs import Worker

HANDLERS = "tests.support.adapter_tracing"
STAGE, TAKE, APPLY = "pending_actions.stage", "pending_actions.take", "pending_actions.apply"


def child_of(span: Span, parent: Span) -> bool:
    return span.trace_id == parent.trace_id and span.parent_id == parent.span_id


def agent_run(url: str, otlp: Receiver, session: str, tenant: str, text: str) -> dict[str, Any]:
    """``run`` of the instrumented agent in its own process, exporting to ``otlp``."""
    done = subprocess.run([sys.executable, "-m", HANDLERS, url, session, tenant, text],
                          cwd=ROOT, env=child_env(otlp.env("agent")), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def test_the_apply_links_into_pydantic_ais_own_trace(tmp_path: Path) -> None:
    session, tenant = f"trace-{uuid.uuid4().hex[:8]}", f"trace-{uuid.uuid4().hex[:8]}"
    file = tmp_path / "notes.jsonl"
    person = TracerProvider().get_tracer("person")  # the person's own, not the global one
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    worker: Worker | None = None
    pa = PendingActions.from_url(server.url, resolve_timeout_s=30)
    try:
        with receiver() as otlp:
            worker = Worker(server.url, handlers=HANDLERS, overrides=FAST,
                            env=otlp.env("workers"), log_path=tmp_path / "worker.log").start()
            pa.set_policy({"default": "ask", "rules": []}, tenant=tenant)
            paused = agent_run(server.url, otlp, session, tenant,
                               prompt("write_note", path=str(file), text="traced"))
            assert paused["status"] == "paused", paused
            [action_id] = paused["pending"]
            assert notes(file) == []

            with person.start_as_current_span("person.approve") as approve:
                result = pa.resolve(session=session, action="apply", reason="fine",
                                    approver="alice")
            assert not result.is_error, result.text
            [note] = notes(file)
            assert note["text"] == "traced" and note["key"] == action_id

            # Pydantic AI's own spans, exported by the agent's process: the agent run (the
            # root of its trace) and the tool call's span, its child
            [tool] = otlp.wait(lambda s: s.service == "agent"
                               and s.attributes.get("gen_ai.tool.name") == "write_note")
            [agent] = otlp.wait(lambda s: s.service == "agent" and s.parent_id == ""
                                and s.trace_id == tool.trace_id)
            assert agent.attributes.get("gen_ai.agent.name") == "notes", agent
            assert child_of(tool, agent) and tool.attributes.get("gen_ai.tool.call.id")
            # the client's stage span, in the same process: a child of the tool call's span
            stage = otlp.one(STAGE, action_id=action_id)
            assert stage.service == "agent" and child_of(stage, tool), (stage, tool)
            assert stage.attributes["pending_actions.session"] == session
            assert stage.attributes["pending_actions.tool"] == "write_note"
            assert stage.attributes["pending_actions.policy.decision"] == "ask"

            # the worker's handler span: in the person's resolve's trace, linked to the stage,
            # so into the agent run's trace
            apply = otlp.one(APPLY, action_id=action_id)
            take = otlp.one(TAKE, action_id=action_id)
            context = approve.get_span_context()
            assert (take.service, take.trace_id, take.parent_id) == (
                "workers", f"{context.trace_id:032x}", f"{context.span_id:016x}")
            assert apply.service == "workers" and child_of(apply, take)
            assert apply.links == [(stage.trace_id, stage.span_id)]
            assert apply.links[0][0] == agent.trace_id != apply.trace_id
            assert apply.attributes["pending_actions.outcome"] == "applied"
            assert apply.attributes["pending_actions.tool"] == "write_note"
    finally:
        pa.close()
        if worker is not None:
            worker.stop()
        server.stop()
