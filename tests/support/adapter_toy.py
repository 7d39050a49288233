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
    """Runs the turns ``agent`` lists one by one. A turn is the arguments of one call of
    ``note`` (of ``careful`` with ``"careful": true``; ``"id"``: the call's id, else its place),
    or ``{"turn": [arguments, ...]}``, several calls decided together, all asked ones paused on
    at once (as a model's response with several tool calls)."""

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
            turn = agent[state["at"]]
            calls = turn.get("turn", [turn])
            texts, asked = [], []
            for place, given in enumerate(calls):
                arguments = dict(given)
                call_id = str(arguments.pop("id", f"call-{state['at']}-{place}"))  # a model's
                if arguments.get("crash"):  # the framework itself fails (a model's error)
                    raise RuntimeError("the toy framework failed")
                tool = CAREFUL if arguments.pop("careful", False) else NOTE
                verdict = await running.decide(tool, call_id, arguments)
                if verdict.decision == "ask":
                    asked.append(ToolCall(call_id, tool.name, arguments))
                elif verdict.decision == "allow":
                    texts.append(str(await tool.call_local(arguments)))
                else:
                    texts.append(verdict.text)
            if asked:
                return Paused(orjson.dumps(state).decode(), asked)
            state["done"].extend(texts)
            state["at"] += 1
        return Done(state["done"])
