"""The OpenAI Agents SDK adapter's test agent: staged tools that write notes (JSON lines in a file
named by their ``path`` argument, so every test counts its own side effects), an offline model
(a subclass of the SDK's own ``Model`` interface) and the agent. Workers import it with
``--handlers``; a "third process" runs ``main`` to resume a run (``python -c``, see ``main``).

The model follows a script given as the user message, JSON: ``{"calls": [{"tool", "args"}],
"log"?}`` (``args`` an object, or a string sent as the raw arguments). Its first turn calls each
tool; once it sees tool results it answers ``model saw: `` and those results, so a test reads
from the run's output what the model was given. Each turn it takes appends a line to ``log``
(when given): the model's invocations, counted across processes."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from agents import (
    Agent,
    ModelResponse,
    ModelSettings,
    Tool,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.testing import assistant_message, function_call
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic import Field

from pending_actions.adapters.openai_agents import resume, staged
from tests.support.adapters import (
    answer,
    append_note,
    fail_once,
    plan_of,
    through_gate,
    wait_to_go,
)

# the SDK's own tracing would export to its hosted backend: no network here
set_tracing_disabled(True)


@staged
def stamped_note(path: str, text: str,
                 stamp: Annotated[str, Field(default_factory=lambda: uuid.uuid4().hex)],
                 tags: set[str] | None = None) -> str:
    """A note with a stamp made anew each time its arguments are validated, and tags (a set,
    whose order differs between processes): what tells calls apart must not see either."""
    append_note(path, text)
    return f"stamped {text!r}"


@staged
def write_note(path: str, text: str, tag: str = "plain") -> str:
    """Append a note to the notes file at ``path``.

    Args:
        path: the notes file
        text: what the note says
        tag: a word to file it under
    """
    append_note(path, text)
    return f"noted {text!r}"


@staged(name="signed_note", needs_approval=True)
def signed_note(path: str, text: str) -> str:
    """A note someone has to sign off (the SDK's own approval flag)."""
    append_note(path, text)
    return f"signed {text!r}"


@staged
def flaky_note(path: str, text: str) -> str:
    """Fails the first time it is applied (the disk is full), then writes the note."""
    fail_once(path)
    append_note(path, text)
    return f"noted {text!r} at last"


@staged
async def gated_note(path: str, text: str, gate: str) -> str:
    """Writes the note once per action (keyed by the apply's idempotency key, so an attempt
    after a crash finds it written), says it started (``<path>.started``, its process id), then
    waits for the test to create the file ``gate``."""
    await through_gate(path, text, gate)
    return f"noted {text!r} past the gate"


@function_tool(needs_approval=True)
def plain_note(path: str, text: str) -> str:
    """The SDK's own tool with its own approval: not staged, so no worker could run it."""
    append_note(path, text)
    return f"plainly noted {text!r}"


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


class NotesModel(Model):
    """The offline model: see the module's docstring."""

    async def get_response(
        self, system_instructions: str | None, input: str | list[TResponseInputItem],
        model_settings: ModelSettings, tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff],
        tracing: ModelTracing, *, previous_response_id: str | None,
        conversation_id: str | None, prompt: ResponsePromptParam | None) -> ModelResponse:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) \
            else list(input)
        first = next(i for i in items if _field(i, "role") == "user")
        plan = plan_of(_field(first, "content"))
        seen = [str(_field(i, "output")) for i in items
                if _field(i, "type") == "function_call_output"]
        output: list[TResponseOutputItem]
        if seen:
            output = [assistant_message("model saw: " + " | ".join(seen))]
        else:
            output = [function_call(c["tool"], c["args"], call_id=f"call-{uuid.uuid4().hex}")
                      for c in plan["calls"]]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    async def stream_response(
        self, system_instructions: str | None, input: str | list[TResponseInputItem],
        model_settings: ModelSettings, tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff],
        tracing: ModelTracing, *, previous_response_id: str | None,
        conversation_id: str | None, prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the tests run the agent without streaming")
        yield  # an async generator, as the interface has it


agent = Agent(name="notes", model=NotesModel(),
              tools=[write_note, signed_note, flaky_note, gated_note, stamped_note])
# an agent with a tool the SDK pauses by itself, that pending_actions cannot stage
plain_agent = Agent(name="plain-notes", model=NotesModel(), tools=[plain_note])


def prompt(tool: str, log: Path | None = None, **args: Any) -> str:
    """The user message that has the model call ``tool`` with ``args``."""
    return calls([(tool, args)], log)


def calls(wanted: list[tuple[str, Any]], log: Path | None = None) -> str:
    """The user message that has the model call each ``(tool, args)`` in one turn."""
    return json.dumps({"calls": [{"tool": t, "args": a} for t, a in wanted],
                       "log": str(log) if log else None})


async def _resume(session: str, tenant: str) -> dict[str, Any]:
    return await answer(resume(agent, session=session, tenant=tenant))


def main(argv: list[str]) -> None:
    """``SESSION TENANT [READY GO]``: resume the session's run with the Redis of the settings
    and print what came of it as JSON. With READY and GO: create READY, then wait for GO to
    exist before resuming (so that two such processes resume at the same moment)."""
    session, tenant = argv[0], argv[1]
    wait_to_go(argv[2:])
    print(json.dumps(asyncio.run(_resume(session, tenant))))


if __name__ == "__main__":
    main(sys.argv[1:])
