"""What the agent-framework adapters add to each framework's own pause and resume, in the same
run. For each framework, with the same offline model (``bench/adapter_agents.py``): the
framework's own human-in-the-loop (its pausing tool, then approve and run again, in this
process) beside ours (``run`` to ``paused``; a person's apply through a real worker, not timed;
``resume`` to ``done``), alternating one by one, ``ROUNDS`` rounds of ``N`` each. Prints each
round's p50 of the pause and of the resume, theirs and ours, and the median and range over the
rounds of what ours adds.

``python -m pending_actions_harness.bench.adapters [--n 100] [--fsync always|everysec]``

Needs the three frameworks installed (the extras ``openai-agents``, ``pydantic-ai`` and
``langgraph``); LangGraph runs on an ``AsyncSqliteSaver`` file, the same for both sides."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import Runner
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command
from pydantic_ai import DeferredToolRequests, DeferredToolResults

from pending_actions.adapters import langgraph as lg
from pending_actions.adapters import openai_agents as oa
from pending_actions.adapters import pydantic_ai as pai
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import AsyncPendingActions, PendingActions
from pending_actions_harness.bench import adapter_agents as agents
from pending_actions_harness.supervise import WorkerProcess

ROUNDS = 3
TENANT = "bench"
ASK = {"default": "ask", "rules": []}
Timed = Callable[[str], Awaitable[tuple[float, float]]]


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


class Sides:
    """Each framework's two sides: one pause and one resume each, timed apart."""

    def __init__(self, pa: AsyncPendingActions, people: PendingActions, db: Path) -> None:
        self.pa, self.people, self.db = pa, people, db

    async def _approve(self, session: str) -> None:
        # a person's apply through the worker: between the two timed halves, not timed
        got = await asyncio.to_thread(self.people.resolve, session=session, action="apply",
                                      reason="bench", approver="alice", tenant=TENANT)
        assert not got.is_error, got.text

    async def _ours(self, session: str, start: Awaitable[Any],
                    cont: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
        started = time.perf_counter()
        paused = await start
        pause = _ms(started)
        assert paused.status == "paused", paused
        await self._approve(session)
        started = time.perf_counter()
        done = await cont()
        assert done.status == "done", done
        return pause, _ms(started)

    # --- OpenAI Agents SDK -------------------------------------------------------------------
    async def openai_own(self, session: str) -> tuple[float, float]:
        started = time.perf_counter()
        result = await Runner.run(agents.openai_own, session)
        pause = _ms(started)
        assert result.interruptions
        started = time.perf_counter()
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)
        done = await Runner.run(agents.openai_own, state)
        assert str(done.final_output).startswith("model saw: noted")
        return pause, _ms(started)

    async def openai_ours(self, session: str) -> tuple[float, float]:
        return await self._ours(
            session, oa.run(agents.openai_ours, session, session=session, tenant=TENANT,
                            pa=self.pa),
            lambda: oa.resume(agents.openai_ours, session=session, tenant=TENANT, pa=self.pa))

    # --- Pydantic AI ----------------------------------------------------------------------------
    async def pydantic_own(self, session: str) -> tuple[float, float]:
        started = time.perf_counter()
        result = await agents.pydantic_own.run(session)
        pause = _ms(started)
        assert isinstance(result.output, DeferredToolRequests)
        started = time.perf_counter()
        approvals: dict[str, Any] = {c.tool_call_id: True for c in result.output.approvals}
        done = await agents.pydantic_own.run(
            message_history=result.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals=approvals))
        assert str(done.output).startswith("model saw: noted")
        return pause, _ms(started)

    async def pydantic_ours(self, session: str) -> tuple[float, float]:
        return await self._ours(
            session, pai.run(agents.pydantic_ours, session, session=session, tenant=TENANT,
                             pa=self.pa),
            lambda: pai.resume(agents.pydantic_ours, session=session, tenant=TENANT,
                               pa=self.pa))

    # --- LangGraph ----------------------------------------------------------------------------
    async def langgraph_own(self, session: str) -> tuple[float, float]:
        config: Any = {"configurable": {"thread_id": session}}
        async with AsyncSqliteSaver.from_conn_string(str(self.db)) as saver:
            graph = agents.graph(saver, ours=False)
            started = time.perf_counter()
            result = await graph.ainvoke({"messages": [HumanMessage(session)]}, config)
            pause = _ms(started)
            assert result.get("__interrupt__")
            started = time.perf_counter()
            done = await graph.ainvoke(Command(resume="apply"), config)
            assert str(done["messages"][-1].content).startswith("model saw: noted")
            return pause, _ms(started)

    async def langgraph_ours(self, session: str) -> tuple[float, float]:
        async with AsyncSqliteSaver.from_conn_string(str(self.db)) as saver:
            graph = agents.graph(saver, ours=True)
            return await self._ours(
                session, lg.run(graph, {"messages": [HumanMessage(session)]}, session=session,
                                tenant=TENANT, pa=self.pa),
                lambda: lg.resume(graph, session=session, tenant=TENANT, pa=self.pa))


async def round_of(own: Timed, ours: Timed, n: int) -> dict[str, float]:
    """``n`` of each, alternating; the p50 of each half."""
    took: dict[str, list[float]] = {k: [] for k in ("own_pause", "own_resume", "ours_pause",
                                                    "ours_resume")}
    for _ in range(n):
        for side, timed in (("own", own), ("ours", ours)):
            pause, resume = await timed(f"bench-{uuid.uuid4().hex[:12]}")
            took[f"{side}_pause"].append(pause)
            took[f"{side}_resume"].append(resume)
    return {k: statistics.median(v) for k, v in took.items()}


async def measure(url: str, db: Path, n: int) -> None:
    people = PendingActions.from_url(url, resolve_timeout_s=30)
    people.set_policy(ASK, tenant=TENANT)
    async with AsyncPendingActions.from_url(url) as pa:
        sides = Sides(pa, people, db)
        for name in ("openai", "pydantic", "langgraph"):
            own, ours = getattr(sides, f"{name}_own"), getattr(sides, f"{name}_ours")
            await round_of(own, ours, 3)  # warm: imports, connections, compiled policies
            rounds = [await round_of(own, ours, n) for _ in range(ROUNDS)]
            for r in rounds:
                print(f"{name:9} pause own {r['own_pause']:.2f} ms ours {r['ours_pause']:.2f}"
                      f" | resume own {r['own_resume']:.2f} ms ours {r['ours_resume']:.2f}")
            for half in ("pause", "resume"):
                added = [r[f"ours_{half}"] - r[f"own_{half}"] for r in rounds]
                print(f"{name:9} {half}: ours adds {statistics.median(added):.2f} ms p50 "
                      f"(range {min(added):.2f}-{max(added):.2f}) over {ROUNDS} rounds of {n}")
    people.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="pauses and resumes a round, a side")
    parser.add_argument("--fsync", default="always", choices=["always", "everysec"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(directory=Path(tmp) / "redis", fsync=args.fsync).start()
        worker = WorkerProcess(server.url, "pending_actions_harness.bench.adapter_agents",
                               log_path=Path(tmp) / "worker.log").start()
        try:
            asyncio.run(measure(server.url, Path(tmp) / "graphs.sqlite", args.n))
        finally:
            worker.stop()
            server.stop()


if __name__ == "__main__":
    main()
