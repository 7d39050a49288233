"""A runnable agent loop around the ``resolve`` tool, with a scripted model standing in for a
real one: ``python -m pending_actions.producers.agent_loop FILE`` (needs a worker running
``--handlers pending_actions.workers.examples`` and ``PENDING_ACTIONS_REDIS_URL``).

It does what the runtime of docs/semantics.md does: an edit tool stages a preview; after every
step the loop asks ``next_tool_choice``, and while something is pending it adds the reminder to
what the model reads and hands the model the ``resolve`` tool (in the Anthropic Messages
format here; ``tool_definition("openai")`` for OpenAI). The resolve carries the id the reminder
was about as ``expect_id``, so the model never applies something it has not seen."""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

from pending_actions.producers.client import PendingActions
from pending_actions.producers.example import propose_edit
from pending_actions.producers.tool import anthropic_tool, intent, render

EDIT_TOOL: dict[str, Any] = {
    "name": "edit_file",
    "description": "Propose new content for a file; the change is previewed, not applied.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                      "content": {"type": "string"}},
                     "required": ["path", "content"]},
}


Step = tuple[str, list[dict[str, Any]]]  # what the model reads, and the tools it is offered


def scripted_model(path: str) -> Generator[dict[str, Any] | None, Step, None]:
    """Stands in for a model: each step gets what the model would read and the tools offered,
    and answers with one tool call, or None when it is done."""
    seen, tools = yield {"name": "edit_file",
                         "input": {"path": path, "content": "hello world\n"}}
    # the preview came with the reminder, and resolve is offered
    assert "<system-reminder>" in seen and "resolve" in {t["name"] for t in tools}
    yield {"name": "resolve", "input": {"action": "apply", "reason": "the typo is fixed"}}
    yield None


def run(pa: PendingActions, session: str, path: str) -> list[str]:
    """Drive the scripted model to the end; returns the transcript, one line per step."""
    model, transcript = scripted_model(path), []
    call = next(model)
    while call is not None:
        tools = [EDIT_TOOL]
        if call["name"] == "edit_file":
            action_id = propose_edit(pa, session, call["input"]["path"], call["input"]["content"])
            observed = pa.show(session, action_id)
            text = observed.payload["diff"] if observed is not None else ""
        else:
            choice = pa.next_tool_choice(session)
            transcript.append(f"model: resolve ({intent(call['input'])})")
            # the model's arguments go only where a model's may: never as an approver
            result = pa.resolve_tool_call(session=session, arguments=call["input"],
                                          expect_id=choice["id"] if choice else None)
            text = render(result)
        choice = pa.next_tool_choice(session)
        if choice is not None and choice.get("tool") == "resolve":
            text += "\n" + choice["reminder"]  # the soft requirement: nothing is taken
            tools.append(anthropic_tool())
        transcript.append(f"{call['name']} -> {text}")
        call = model.send((text, tools))
    return transcript


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "notes.txt")
    if not path.exists():
        path.write_text("helo world\n")
    pa = PendingActions()
    print("\n".join(run(pa, "agent-loop-example", str(path))))


if __name__ == "__main__":
    main()
