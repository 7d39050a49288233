"""A toy framework for the adapters' shared core (tests/test_adapter_core.py): an "agent" is a
list of tool calls made in turn, and its state is how many it has made and what each gave. The
real frameworks are driven by their own tests; this one exercises what is common to them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from pending_actions.adapters import applying
from pending_actions.adapters.core import Done, Paused, Step, Tool, ToolCall, current

EXTRA = "toy"


def note(text: str) -> str:
    """Appends ``text`` to the file $TOY_EFFECTS once per action (keyed by idempotency key)."""
    where = Path(os.environ["TOY_EFFECTS"])
    now = applying()
    key = now.idempotency_key if now else "local"
    seen = where.read_text().splitlines() if where.exists() else []
    if now is None or not any(line.startswith(key + " ") for line in seen):
        with where.open("a") as f:
            f.write(f"{key} {text}\n")
    if text == "fail":
        raise RuntimeError("asked to fail")
    return f"noted {text}"


NOTE = Tool(EXTRA, "note", note)


def careful(text: str) -> str:
    """``note`` with its framework's approval flag set: people decide, whatever is allowed."""
    return note(text)


CAREFUL = Tool(EXTRA, "careful", careful, asks=True)


class Toy:
    """Runs the calls ``agent`` lists (the arguments of ``note``, or of ``careful`` with
    ``"careful": true``; ``"id"``: the call's id, else its place) one by one; pauses on an
    ask."""

    extra = EXTRA

    async def start(self, agent: Any, input: Any, session: str,
                    options: dict[str, Any]) -> Step:
        return await self._go(agent, {"done": [], "at": 0})

    async def cont(self, agent: Any, state: str, session: str,
                   options: dict[str, Any]) -> Step:
        return await self._go(agent, orjson.loads(state))

    async def _go(self, agent: list[dict[str, Any]], state: dict[str, Any]) -> Step:
        running = current()
        while state["at"] < len(agent):
            arguments = dict(agent[state["at"]])
            call_id = str(arguments.pop("id", f"call-{state['at']}"))  # a model's own ids
            if arguments.get("crash"):  # the framework itself fails (a model's error, say)
                raise RuntimeError("the toy framework failed")
            tool = CAREFUL if arguments.pop("careful", False) else NOTE
            verdict = await running.decide(tool, call_id, arguments)
            if verdict.decision == "ask":
                return Paused(orjson.dumps(state).decode(),
                              [ToolCall(call_id, tool.name, arguments)])
            text = str(await tool.call_local(arguments)) if verdict.decision == "allow" \
                else verdict.text
            state["done"].append(text)
            state["at"] += 1
        return Done(state["done"])
