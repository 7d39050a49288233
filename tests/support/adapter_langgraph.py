"""The LangGraph adapter's test graph: staged tools that write notes (JSON lines in a file named
by their ``path`` argument, so every test counts its own side effects), a scripted "model" node
(no LLM), LangGraph's own ``ToolNode`` and ``tools_condition``, and a checkpointer every process
reads: ``AsyncSqliteSaver`` on a file the test names. Workers import it with ``--handlers``; a
"third process" runs ``main`` to resume a run (``python -c``, see ``main``).

The model follows a script given as the first user message, JSON: ``{"calls": [{"tool",
"args"}, ...], "log"?}``. Its first turn asks for all those calls at once (one AIMessage with
tool_calls); once it sees tool results it answers ``model saw: `` and those results, so a test
reads from the final state what the model was given. Each turn it takes appends a line to
``log`` (when given): the model's invocations, counted across processes."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send

from pending_actions.adapters.langgraph import resume, staged
from tests.support.adapters import (
    answer,
    append_note,
    fail_once,
    plan_of,
    through_gate,
    wait_to_go,
)


@staged
def write_note(path: str, text: str) -> str:
    """Append a note to the notes file at ``path``."""
    append_note(path, text)
    return f"noted {text!r}"


@staged(name="signed_note", interrupt_on=True)
def signed_note(path: str, text: str) -> str:
    """A note someone has to sign off (HumanInTheLoopMiddleware's interrupt_on entry)."""
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


@staged
async def slow_note(path: str, text: str, seconds: float) -> str:
    """Takes ``seconds`` before it writes the note: a call still running when another call of
    its turn has paused the graph."""
    await asyncio.sleep(seconds)
    append_note(path, text)
    return f"noted {text!r} slowly"


TOOLS = [write_note, signed_note, flaky_note, gated_note, slow_note]


def model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    """The scripted model: see the module's docstring."""
    messages = state["messages"]
    first = next(m for m in messages if isinstance(m, HumanMessage))
    plan = plan_of(first.content)
    seen: list[ToolMessage] = []
    for message in reversed(messages):  # the results of the last turn's calls
        if not isinstance(message, ToolMessage):
            break
        seen.insert(0, message)
    if seen:
        return {"messages": [AIMessage("model saw: " + " | ".join(
            str(m.content) for m in seen))]}
    calls = [{"name": c["tool"], "args": c["args"], "id": f"call_{uuid.uuid4().hex[:12]}",
              "type": "tool_call"} for c in plan["calls"]]
    return {"messages": [AIMessage("", tool_calls=calls)]}


def per_call(state: MessagesState) -> list[Send] | str:
    """Each of the last turn's calls to the tool node as a task of its own (the Send API), as
    LangChain v1's ``create_agent`` dispatches them: each call that pauses is an interrupt of
    its own."""
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return [Send("tools", {"__type": "tool_call_with_context", "tool_call": call,
                               "state": state}) for call in last.tool_calls]
    return END


def graph(checkpointer: BaseCheckpointSaver[Any],
          sends: bool = False) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model -> tools (while the model asks for tools) -> model, on ``checkpointer``. The tool
    node runs a turn's calls together (``tools_condition``), or one task a call (``sends``)."""
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode(TOOLS))
    builder.add_edge(START, "model")
    if sends:
        builder.add_conditional_edges("model", per_call, ["tools", END])
    else:
        builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


@asynccontextmanager
async def opened(db: str | Path,
                 sends: bool = False) -> AsyncIterator[CompiledStateGraph[Any, Any, Any, Any]]:
    """The graph on the SQLite checkpoint file ``db``, which every process opens the same."""
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        yield graph(saver, sends)


def prompt(*calls: tuple[str, dict[str, Any]], log: Path | None = None) -> dict[str, Any]:
    """The graph's input that has the model ask for ``calls`` (tool, arguments) in one turn."""
    plan = {"calls": [{"tool": tool, "args": args} for tool, args in calls],
            "log": str(log) if log else None}
    return {"messages": [HumanMessage(json.dumps(plan))]}


def said(state: dict[str, Any]) -> str:
    """What the model said last, in a final state."""
    return str(state["messages"][-1].content)


async def _resume(db: str, session: str, tenant: str, sends: bool) -> dict[str, Any]:
    async with opened(db, sends) as agent:
        return await answer(resume(agent, session=session, tenant=tenant), said)


def main(argv: list[str]) -> None:
    """``[--sends] DB SESSION TENANT [READY GO]``: resume the session's run, its graph on the
    checkpoint file DB (``--sends``: the graph that sends each call as a task of its own), with
    the Redis of the settings, and print what came of it as JSON (``output``: what the model
    said last). With READY and GO: create READY, then wait for GO to exist before resuming (so
    that two such processes resume at the same moment)."""
    sends = argv[:1] == ["--sends"]
    if sends:
        argv = argv[1:]
    db, session, tenant = argv[0], argv[1], argv[2]
    wait_to_go(argv[3:])
    print(json.dumps(asyncio.run(_resume(db, session, tenant, sends))))


if __name__ == "__main__":
    main(sys.argv[1:])
