"""CONTRACT section 9, LangGraph: ``pending_actions.adapters.langgraph`` drives a compiled graph
with no LLM (a scripted model node, LangGraph's own ``ToolNode`` and ``tools_condition``,
tests/support/adapter_langgraph.py) on a SQLite checkpoint file every process opens, against a
real Redis and real worker processes. A call the policy asks about pauses the graph with
``interrupt()`` (``paused``); a person approves it from another process (the CLI); a third
process resumes the graph with ``Command(resume=...)``, and the model reads the handler's result
as the tool's result. Also: discard, deny, allow, a failed apply, a worker SIGKILLed mid-apply,
two resumes at once, ``interrupt_on`` over a policy that allows, and one model turn that mixes
asks, an allowed call and a denied one (the tool node re-runs on resume: nothing twice)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

from pending_actions import NotPaused
from pending_actions.adapters import langgraph as adapter
from pending_actions.adapters.langgraph import AgentRun, run, staged
from tests.support import adapters as shared
from tests.support.adapter_langgraph import graph, opened, prompt, said, write_note

HANDLERS = "tests.support.adapter_langgraph"


url, session, tenant = shared.suite_fixtures(HANDLERS, "redis-langgraph", "lg")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """The test's checkpoint file: the graph's state, read by every process of the test."""
    return tmp_path / "checkpoints.sqlite"


def resumed_elsewhere(url: str, db: Path, session: str, tenant: str,
                      sends: bool = False) -> dict[str, Any]:
    """What came of a process that imports the graph, opens the checkpoint file and resumes the
    run (support's ``main``)."""
    sent = ["--sends"] if sends else []
    return shared.outcome(shared.third(url, HANDLERS, *sent, str(db), session, tenant))


async def start(url: str, db: Path, input: Any, session: str, tenant: str,
                policy: dict[str, Any] | None = None, sends: bool = False) -> AgentRun:
    async with shared.client(url) as pa, opened(db, sends) as agent:
        if policy is not None:
            await pa.set_policy(policy, tenant=tenant)
        return await run(agent, input, session=session, tenant=tenant, pa=pa)


def test_ask_pauses_the_model_is_refused_a_person_approves_and_a_third_process_resumes(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    ask = prompt(("write_note", {"path": str(file), "text": "hello"}), log=log)

    async def pause_and_look() -> tuple[AgentRun, Any, Any, Any]:
        async with opened(db) as agent:
            paused, action, refused = await shared.pause_and_refuse_the_model(
                url, session, tenant,
                lambda pa: run(agent, ask, session=session, tenant=tenant, pa=pa))
            snapshot = await agent.aget_state({"configurable": {"thread_id": session}})
            return paused, action, refused, snapshot

    paused, action, refused, snapshot = asyncio.run(pause_and_look())
    shared.asked_and_refused(url, session, paused, action, refused, file)
    assert action.payload == {"path": str(file), "text": "hello"}
    assert action.apply == "langgraph:write_note"
    # the graph paused LangGraph's way: the checkpointer holds the interrupt of the call
    [pause] = snapshot.interrupts
    assert snapshot.next == ("tools",)
    assert pause.value["type"] == adapter.INTERRUPT_TYPE
    assert pause.value["tool"] == "write_note" and pause.value["arguments"] == action.payload
    shared.approved_applied_and_resumed(url, session, action.id, file, log,
                                        lambda: resumed_elsewhere(url, db, session, tenant))


def test_a_person_discards_and_the_model_sees_the_discard(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    args = {"path": str(file), "text": "bye"}
    paused = asyncio.run(start(url, db, prompt(("write_note", args)), session, tenant))
    assert paused.status == "paused"
    shared.discarded(url, session, paused.pending[0], file, args,
                     lambda: resumed_elsewhere(url, db, session, tenant))


def test_deny_answers_the_model_with_the_reason_and_the_run_goes_on(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    done = asyncio.run(start(url, db, prompt(("write_note", {"path": str(file), "text": "x"})),
                             session, tenant, shared.READ_ONLY))
    assert done.status == "done" and done.pending == []
    assert said(done.output).startswith("model saw: Denied: notes are read-only today"), \
        said(done.output)
    [result] = [m for m in done.output["messages"] if isinstance(m, ToolMessage)]
    assert result.name == "write_note" and result.status == "success"
    shared.denied(url, session, file)


def test_allow_runs_the_tool_at_once_in_the_calling_process(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    done = asyncio.run(start(url, db, prompt(("write_note", {"path": str(file), "text": "now"})),
                             session, tenant, shared.ALLOW))
    assert (done.status, done.pending) == ("done", [])
    assert said(done.output) == "model saw: noted 'now'"
    shared.ran_here(url, session, file)


def test_a_failed_apply_stays_pending_under_the_same_id_until_it_succeeds(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, db, prompt(("flaky_note", {"path": str(file),
                                                               "text": "retry"})),
                               session, tenant))
    [action_id] = paused.pending
    shared.failed_then_applied(url, session, action_id, file,
                               lambda: resumed_elsewhere(url, db, session, tenant))


def test_a_worker_killed_mid_apply_is_recovered_and_the_note_is_written_once(
        tmp_path: Path, db: Path, session: str, tenant: str) -> None:
    """A deployment of its own: this test kills its worker."""
    file, gate = tmp_path / "notes.jsonl", tmp_path / "gate"
    with shared.deployment(tmp_path / "redis", HANDLERS, gate) as own:
        paused = asyncio.run(start(
            own.url, db,
            prompt(("gated_note", {"path": str(file), "text": "once", "gate": str(gate)})),
            session, tenant))
        [action_id] = paused.pending
        shared.killed_mid_apply(own, session, action_id, file)
        assert resumed_elsewhere(own.url, db, session, tenant)["status"] == "paused"

        shared.applied_past_the_gate(own, session, action_id, file, gate)

        done = resumed_elsewhere(own.url, db, session, tenant)
        assert done == {"status": "done", "output": "model saw: noted 'once' past the gate",
                        "pending": []}
        assert len(shared.notes(file)) == 1


def test_two_resumes_at_once_continue_the_run_once(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    paused = asyncio.run(start(url, db, prompt(("write_note", {"path": str(file),
                                                               "text": "twice?"}), log=log),
                               session, tenant))
    shared.approve(url, session, "apply", "ok", paused.pending[0])
    shared.resumed_once_of_two(url, HANDLERS, str(db), session, tenant, tmp_path=tmp_path,
                               file=file, log=log)


def test_interrupt_on_asks_people_even_where_the_policy_allows(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, db, prompt(("signed_note", {"path": str(file),
                                                                "text": "sign"})),
                               session, tenant, shared.ALLOW))
    assert paused.status == "paused"
    [action] = asyncio.run(shared.pending(url, session))
    assert action.tool == "signed_note" and action.apply == "langgraph:signed_note"
    assert shared.notes(file) == []

    shared.signed_off(url, session, action.id, file,
                      lambda: resumed_elsewhere(url, db, session, tenant))


def test_one_turn_of_asks_an_allowed_and_a_denied_call_pauses_once_and_runs_each_once(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    """ToolNode runs a turn's calls in one node, which LangGraph re-runs from its start on
    resume, and whose first interrupt() ends it: both asks are staged in the one pause, the
    allowed call ran once (here), the denied one is recorded once."""
    file = tmp_path / "notes.jsonl"
    policy = {"default": "ask", "rules": [
        {"name": "free", "match": {"payload": {"text": "free*"}}, "decision": "allow"},
        {"name": "secret", "match": {"payload": {"text": "secret*"}}, "decision": "deny",
         "reason": "no secrets"}]}
    calls = [("write_note", {"path": str(file), "text": text})
             for text in ("a", "free b", "secret c", "d")]
    paused = asyncio.run(start(url, db, prompt(*calls), session, tenant, policy))
    assert paused.status == "paused" and len(paused.pending) == 2
    staged_calls = asyncio.run(shared.pending(url, session))
    assert sorted(a.payload["text"] for a in staged_calls) == ["a", "d"]
    assert sorted(a.id for a in staged_calls) == sorted(paused.pending)
    assert [n["text"] for n in shared.notes(file)] == ["free b"]
    for action in staged_calls:  # the newest first: a resolve takes the session's newest
        shared.approve(url, session, "apply", "ok", action.id)

    done = resumed_elsewhere(url, db, session, tenant)
    assert done["status"] == "done"
    said_a, said_b, said_c, said_d = done["output"].removeprefix("model saw: ").split(" | ")
    assert (said_a, said_b, said_d) == ("noted 'a'", "noted 'free b'", "noted 'd'"), done
    assert said_c.startswith("Denied: no secrets") and said_c.endswith("Nothing was run.")
    assert sorted(n["text"] for n in shared.notes(file)) == ["a", "d", "free b"]
    [free] = [n for n in shared.notes(file) if n["text"] == "free b"]
    assert free["pid"] == os.getpid()  # run here at first, not again in the third process
    history = [e["event"] for e in asyncio.run(shared.events(url, session))]
    assert history.count("denied") == 1 and history.count("applied") == 2


def test_an_allowed_call_still_running_when_its_turn_pauses_is_waited_for_and_not_run_again(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    """ToolNode's first interrupt ends the node while the turn's other calls still run
    (asyncio.gather): run() waits for them, so the allowed call finishes here, and its result
    is given again, not run again, when the node re-runs on resume."""
    file = tmp_path / "notes.jsonl"
    policy = {"default": "ask", "rules": [
        {"name": "slow", "match": {"tool": "slow_note"}, "decision": "allow"}]}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("write_note", {"path": str(file), "text": "a"}),
        ("slow_note", {"path": str(file), "text": "b", "seconds": 0.5})]
    paused = asyncio.run(start(url, db, prompt(*calls), session, tenant, policy))
    assert paused.status == "paused" and len(paused.pending) == 1
    [slow] = shared.notes(file)  # done before run() said paused
    assert slow["text"] == "b" and slow["pid"] == os.getpid()
    shared.approve(url, session, "apply", "ok", paused.pending[0])

    done = resumed_elsewhere(url, db, session, tenant)
    assert done["output"] == "model saw: noted 'a' | noted 'b' slowly", done
    assert sorted(n["text"] for n in shared.notes(file)) == ["a", "b"]


def test_calls_sent_as_tasks_of_their_own_pause_as_interrupts_resumed_by_their_ids(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    """Dispatched with the Send API (as LangChain v1's create_agent does), each call is a task
    and each ask an interrupt of its own: LangGraph takes the resume only as a map of interrupt
    ids to values when several are pending, and re-runs only the paused tasks."""
    file = tmp_path / "notes.jsonl"
    policy = {"default": "ask", "rules": [
        {"name": "free", "match": {"payload": {"text": "free*"}}, "decision": "allow"}]}
    calls = [("write_note", {"path": str(file), "text": text}) for text in ("a", "free b", "d")]
    paused = asyncio.run(start(url, db, prompt(*calls), session, tenant, policy, sends=True))
    assert paused.status == "paused" and len(paused.pending) == 2

    async def interrupts() -> list[Any]:
        async with opened(db, sends=True) as agent:
            snapshot = await agent.aget_state({"configurable": {"thread_id": session}})
            return list(snapshot.interrupts)

    pauses = asyncio.run(interrupts())
    assert sorted(p.value["arguments"]["text"] for p in pauses) == ["a", "d"]
    assert len({p.id for p in pauses}) == 2
    for action in asyncio.run(shared.pending(url, session)):  # the newest first
        shared.approve(url, session, "apply", "ok", action.id)

    done = resumed_elsewhere(url, db, session, tenant, sends=True)
    assert done["status"] == "done"
    seen = done["output"].removeprefix("model saw: ").split(" | ")
    assert sorted(seen) == ["noted 'a'", "noted 'd'", "noted 'free b'"], done
    assert sorted(n["text"] for n in shared.notes(file)) == ["a", "d", "free b"]
    assert asyncio.run(interrupts()) == []


def test_staged_keeps_the_functions_schema_and_takes_the_call_id_from_langchain() -> None:
    tool = staged(name="send_mail_schema_test", parse_docstring=True)(shared.send)
    assert tool.name == "send_mail_schema_test"
    assert tool.description == "Send a message."
    schema = tool.tool_call_schema
    assert isinstance(schema, type) and issubclass(schema, BaseModel)
    shown = schema.model_json_schema()  # what the model is shown
    assert shown["required"] == ["to", "body"]
    assert shown["properties"]["to"]["description"] == "who gets it"
    assert set(shown["properties"]) == {"to", "body", "cc"}  # no tool_call_id
    assert write_note.args == {"path": {"title": "Path", "type": "string"},
                               "text": {"title": "Text", "type": "string"}}
    with pytest.raises(TypeError, match="when"):
        staged(shared.send, name="send_when_test", interrupt_on={"when": lambda request: True})


def test_a_staged_tool_outside_run_is_not_run(tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"

    async def body() -> None:
        agent = graph(InMemorySaver())
        await agent.ainvoke(prompt(("write_note", {"path": str(file), "text": "sneaky"})),
                            config={"configurable": {"thread_id": "outside"}})

    with pytest.raises(RuntimeError, match="outside"):
        asyncio.run(body())
    assert shared.notes(file) == []


def test_a_checkpointer_of_one_process_is_refused(url: str, session: str,
                                                  tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"

    async def body() -> None:
        async with shared.client(url) as pa:
            await run(graph(InMemorySaver()),
                      prompt(("write_note", {"path": str(file), "text": "lost"})),
                      session=session, pa=pa)

    with pytest.raises(TypeError, match="InMemorySaver"):
        asyncio.run(body())
    assert asyncio.run(shared.pending(url, session)) == []


def test_a_pause_that_is_no_staged_tools_is_refused(url: str, db: Path, session: str,
                                                     tenant: str) -> None:
    """An interrupt() of the graph's own (or HumanInTheLoopMiddleware's) is not a call people
    decide in the inbox: the run says so instead of reporting a pause nobody can resume."""
    def ask_a_human(state: MessagesState) -> dict[str, Any]:
        return {"messages": [HumanMessage(str(interrupt("what now?")))]}

    async def body() -> None:
        builder = StateGraph(MessagesState)
        builder.add_node("human", ask_a_human)
        builder.add_edge(START, "human")
        async with shared.client(url) as pa:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
            async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
                await run(builder.compile(checkpointer=saver), {"messages": []},
                          session=session, tenant=tenant, pa=pa)

    with pytest.raises(RuntimeError, match="no staged tool's"):
        asyncio.run(body())


def test_resume_of_a_session_with_no_paused_run_is_not_paused(url: str, db: Path,
                                                              session: str) -> None:
    async def body() -> None:
        async with shared.client(url) as pa, opened(db) as agent:
            await adapter.resume(agent, session=session, pa=pa)

    with pytest.raises(NotPaused):
        asyncio.run(body())

