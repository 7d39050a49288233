"""The Pydantic AI adapter's test agent: staged tools that write notes (JSON lines in a file
named by their ``path`` argument, so every test counts its own side effects), an offline model
(Pydantic AI's ``FunctionModel``) and the agent. Workers import it with ``--handlers``; a
"third process" runs ``main`` to resume a run (``python -c``, see ``main``).

The model follows a script given as the user prompt, JSON: ``{"tool", "args", "log"?}`` (or
``{"calls": [{"tool", "args"}, ...]}``). Its first turn calls ``tool`` with ``args``; once it
sees tool results it answers ``model saw: `` and those results, so a test reads from the run's
output what the model was given. Each turn it takes appends a line to ``log`` (when given): the
model's invocations, counted across processes."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pending_actions.adapters.pydantic_ai import resume, staged
from tests.support.adapters import (
    answer,
    append_note,
    fail_once,
    plan_of,
    through_gate,
    wait_to_go,
)
from tests.support.adapters import notes as notes  # tests/test_adapter_tracing.py reads it here


@staged
def write_note(path: str, text: str) -> str:
    """Append a note to the notes file at ``path``."""
    append_note(path, text)
    return f"noted {text!r}"


@staged(name="signed_note", requires_approval=True)
def signed_note(path: str, text: str) -> str:
    """A note someone has to sign off (Pydantic AI's own approval flag)."""
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


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The offline model: see the module's docstring."""
    first = next(p for m in messages if isinstance(m, ModelRequest) for p in m.parts
                 if isinstance(p, UserPromptPart))
    plan = plan_of(first.content)
    # every tool result since the model's last response (a resumed run may send the results of
    # calls that ran before the pause in a request of their own)
    since = [m for m in messages[_last_response(messages) + 1:] if isinstance(m, ModelRequest)]
    seen = [p for m in since for p in m.parts if isinstance(p, ToolReturnPart)]
    if seen:
        return ModelResponse(parts=[TextPart("model saw: " + " | ".join(
            str(p.content) for p in sorted(seen, key=lambda p: p.tool_name)))])
    calls = plan.get("calls") or [{"tool": plan["tool"], "args": plan["args"]}]
    return ModelResponse(parts=[ToolCallPart(c["tool"], c["args"]) for c in calls])


def _last_response(messages: list[ModelMessage]) -> int:
    return max((i for i, m in enumerate(messages) if isinstance(m, ModelResponse)), default=-1)


agent = Agent(FunctionModel(script), name="notes",
              tools=[write_note, signed_note, flaky_note, gated_note])


def prompt(tool: str, log: Path | None = None, **args: Any) -> str:
    """The user prompt that has the model call ``tool`` with ``args``."""
    return json.dumps({"tool": tool, "args": args, "log": str(log) if log else None})


def prompt_calls(*calls: tuple[str, dict[str, Any]]) -> str:
    """The user prompt that has the model make several calls in one response."""
    return json.dumps({"calls": [{"tool": t, "args": a} for t, a in calls]})


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
