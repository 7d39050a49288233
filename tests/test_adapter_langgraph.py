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
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

from pending_actions import AsyncPendingActions, NotPaused
from pending_actions.adapters import langgraph as adapter
from pending_actions.adapters.core import label
from pending_actions.adapters.langgraph import AgentRun, run, staged
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from tests.support.adapter_langgraph import graph, notes, opened, prompt, said, write_note
from tests.support.faults import FAST
from tests.support.procs import Worker, worker_env

HANDLERS = "tests.support.adapter_langgraph"
CLI = str(Path(sys.executable).parent / "pending-actions")
THIRD = "import sys; from tests.support.adapter_langgraph import main; main(sys.argv[1:])"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of its own and a worker that imports the staged tools."""
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-langgraph")).start()
    worker = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
    yield server.url
    worker.stop()
    server.stop()


@pytest.fixture
def session() -> str:
    return f"lg-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tenant() -> str:
    """Each test its own tenant, so that its policy is its own."""
    return f"lg-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """The test's checkpoint file: the graph's state, read by every process of the test."""
    return tmp_path / "checkpoints.sqlite"


def client(url: str) -> AsyncPendingActions:
    return AsyncPendingActions.from_url(url, resolve_timeout_s=30)


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``pending-actions ARGS`` in a process of its own: another person, another machine."""
    return subprocess.run([CLI, *args], env=worker_env(url), cwd=ROOT, capture_output=True,
                          text=True, timeout=90)


def person(url: str, session: str, action: str, reason: str, expect_id: str,
           approver: str = "alice") -> subprocess.CompletedProcess[str]:
    return cli(url, "resolve", "--session", session, "--action", action, "--reason", reason,
               "--approver", approver, "--expect-id", expect_id, "--timeout", "60")


def third(url: str, db: Path, session: str, tenant: str, *barrier: Path,
          sends: bool = False) -> subprocess.Popen[str]:
    """A process that imports the graph, opens the checkpoint file and resumes the run."""
    return subprocess.Popen([sys.executable, "-c", THIRD, *(["--sends"] if sends else []),
                             str(db), session, tenant, *map(str, barrier)],
                            env=worker_env(url), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def resumed_elsewhere(url: str, db: Path, session: str, tenant: str,
                      sends: bool = False) -> dict[str, Any]:
    return outcome(third(url, db, session, tenant, sends=sends))


async def start(url: str, db: Path, input: Any, session: str, tenant: str,
                policy: dict[str, Any] | None = None, sends: bool = False) -> AgentRun:
    async with client(url) as pa, opened(db, sends) as agent:
        if policy is not None:
            await pa.set_policy(policy, tenant=tenant)
        return await run(agent, input, session=session, tenant=tenant, pa=pa)


async def pending(url: str, session: str) -> list[Any]:
    async with client(url) as pa:
        return await pa.pending(session)


async def events(url: str, session: str) -> list[dict[str, Any]]:
    async with client(url) as pa:
        return await pa.history(session)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_ask_pauses_the_model_is_refused_a_person_approves_and_a_third_process_resumes(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    ask = prompt(("write_note", {"path": str(file), "text": "hello"}), log=log)

    async def pause_and_refuse_the_model() -> tuple[AgentRun, Any, Any, Any]:
        async with client(url) as pa, opened(db) as agent:
            await pa.set_policy({"default": "ask", "rules": []}, tenant=tenant)
            paused = await run(agent, ask, session=session, tenant=tenant, pa=pa)
            [action] = await pa.pending(session)
            refused = await pa.resolve(session=session, action="apply",
                                       reason="the model approves itself")
            snapshot = await agent.aget_state({"configurable": {"thread_id": session}})
            return paused, action, refused, snapshot

    paused, action, refused, snapshot = asyncio.run(pause_and_refuse_the_model())
    assert (paused.status, paused.output, paused.pending) == ("paused", None, [action.id])
    assert paused.session == session
    assert action.tool == "write_note"
    assert action.payload == {"path": str(file), "text": "hello"}
    assert action.label == label("write_note", action.payload)  # the name, the values
    assert action.label.startswith('write_note(path="') and 'text="hello"' in action.label
    assert action.apply == "langgraph:write_note" and action.reject is None
    assert action.policy is not None and action.policy["decision"] == "ask"
    assert refused.is_error and refused.text.startswith("Needs approval:"), refused.text
    # the graph paused LangGraph's way: the checkpointer holds the interrupt of the call
    [pause] = snapshot.interrupts
    assert snapshot.next == ("tools",)
    assert pause.value["type"] == adapter.INTERRUPT_TYPE
    assert pause.value["tool"] == "write_note" and pause.value["arguments"] == action.payload
    assert [a.id for a in asyncio.run(pending(url, session))] == [action.id]
    assert notes(file) == []

    approved = person(url, session, "apply", "fine by me", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    [note] = notes(file)
    assert note["text"] == "hello" and note["pid"] != os.getpid()  # a worker applied it
    assert note["key"] == action.id  # the idempotency key reached the body

    done = resumed_elsewhere(url, db, session, tenant)
    assert done == {"status": "done", "output": "model saw: noted 'hello'", "pending": []}
    assert len(notes(file)) == 1
    assert lines(log) == 2  # the turn that called the tool, the turn that saw its result
    applied = [e for e in asyncio.run(events(url, session)) if e["event"] == "applied"]
    assert [e["id"] for e in applied] == [action.id]
    assert "alice" in json.dumps(applied[0])
    # the run is over: nothing to resume any more
    assert resumed_elsewhere(url, db, session, tenant)["error"] == "NotPaused"


def test_a_person_discards_and_the_model_sees_the_discard(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    args = {"path": str(file), "text": "bye"}
    paused = asyncio.run(start(url, db, prompt(("write_note", args)), session, tenant))
    assert paused.status == "paused"
    discarded = person(url, session, "discard", "not today", paused.pending[0])
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr

    done = resumed_elsewhere(url, db, session, tenant)
    shown = label("write_note", args)
    assert done["status"] == "done"
    assert done["output"] == f"model saw: Discarded: {shown}. Reason: not today", done
    assert notes(file) == []


def test_deny_answers_the_model_with_the_reason_and_the_run_goes_on(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    policy = {"default": "allow", "rules": [
        {"name": "read-only", "match": {"tool": "write_note"}, "decision": "deny",
         "reason": "notes are read-only today"}]}
    done = asyncio.run(start(url, db, prompt(("write_note", {"path": str(file), "text": "x"})),
                             session, tenant, policy))
    assert done.status == "done" and done.pending == []
    assert said(done.output).startswith("model saw: Denied: notes are read-only today"), \
        said(done.output)
    [result] = [m for m in done.output["messages"] if isinstance(m, ToolMessage)]
    assert result.name == "write_note" and result.status == "success"
    assert asyncio.run(pending(url, session)) == []
    assert "denied" in [e["event"] for e in asyncio.run(events(url, session))]
    assert notes(file) == []


def test_allow_runs_the_tool_at_once_in_the_calling_process(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    done = asyncio.run(start(url, db, prompt(("write_note", {"path": str(file), "text": "now"})),
                             session, tenant, {"default": "allow", "rules": []}))
    assert (done.status, done.pending) == ("done", [])
    assert said(done.output) == "model saw: noted 'now'"
    [note] = notes(file)
    assert note["pid"] == os.getpid() and note["key"] is None  # here, not in a worker
    assert asyncio.run(pending(url, session)) == []


def test_a_failed_apply_stays_pending_under_the_same_id_until_it_succeeds(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, db, prompt(("flaky_note", {"path": str(file),
                                                               "text": "retry"})),
                               session, tenant))
    [action_id] = paused.pending

    failed = person(url, session, "apply", "go", action_id)
    assert failed.returncode == 1 and "the disk is full" in failed.stdout, failed.stdout
    [still] = asyncio.run(pending(url, session))
    assert still.id == action_id and still.attempts == 1
    again = resumed_elsewhere(url, db, session, tenant)
    assert again == {"status": "paused", "output": None, "pending": [action_id]}

    applied = person(url, session, "apply", "go again", action_id)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    done = resumed_elsewhere(url, db, session, tenant)
    assert done == {"status": "done", "output": "model saw: noted 'retry' at last",
                    "pending": []}
    assert len(notes(file)) == 1


def test_a_worker_killed_mid_apply_is_recovered_and_the_note_is_written_once(
        tmp_path: Path, db: Path, session: str, tenant: str) -> None:
    """A deployment of its own: this test kills its worker."""
    file, gate = tmp_path / "notes.jsonl", tmp_path / "gate"
    started = Path(str(file) + ".started")
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    first = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
    second: Worker | None = None
    try:
        paused = asyncio.run(start(
            server.url, db,
            prompt(("gated_note", {"path": str(file), "text": "once", "gate": str(gate)})),
            session, tenant))
        [action_id] = paused.pending
        resolving = subprocess.Popen(
            [CLI, "resolve", "--session", session, "--action", "apply", "--reason", "go",
             "--approver", "alice", "--expect-id", action_id, "--timeout", "60"],
            env=worker_env(server.url), cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        wait_until(lambda: lines(started) == 1, "the body never started")
        assert int(started.read_text().split()[0]) in first.tree()
        assert len(notes(file)) == 1  # written, not yet returned
        first.kill()  # SIGKILL, the whole worker: its resolver too
        # a new worker's resolver finds the lease ended and ends the attempt with it
        second = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
        out, err = resolving.communicate(timeout=90)
        assert resolving.returncode == 1 and "interrupted" in out, out + err
        [back] = asyncio.run(pending(server.url, session))
        assert (back.id, back.attempts) == (action_id, 1)  # pending again, the same id
        assert resumed_elsewhere(server.url, db, session, tenant)["status"] == "paused"

        gate.write_text("open")
        again = person(server.url, session, "apply", "go again", action_id)
        assert again.returncode == 0, again.stdout + again.stderr
        assert lines(started) == 2  # the body ran twice...
        [note] = notes(file)  # ...and wrote once: the second found its key written
        assert note["key"] == action_id

        done = resumed_elsewhere(server.url, db, session, tenant)
        assert done == {"status": "done", "output": "model saw: noted 'once' past the gate",
                        "pending": []}
        assert len(notes(file)) == 1
    finally:
        gate.write_text("open")
        if second is not None:
            second.stop()
        first.kill()
        server.stop()


def test_two_resumes_at_once_continue_the_run_once(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    paused = asyncio.run(start(url, db, prompt(("write_note", {"path": str(file),
                                                               "text": "twice?"}), log=log),
                               session, tenant))
    approved = person(url, session, "apply", "ok", paused.pending[0])
    assert approved.returncode == 0, approved.stdout + approved.stderr

    go = tmp_path / "go"
    ready = [tmp_path / "ready-a", tmp_path / "ready-b"]
    procs = [third(url, db, session, tenant, r, go) for r in ready]
    wait_until(lambda: all(r.exists() for r in ready), "the resumes never got ready")
    go.write_text("go")
    answers = sorted((outcome(p) for p in procs), key=lambda a: "error" in a)
    assert answers[0] == {"status": "done", "output": "model saw: noted 'twice?'",
                          "pending": []}
    assert answers[1]["error"] == "NotPaused", answers
    assert lines(log) == 2  # the model went on once
    assert len(notes(file)) == 1


def test_interrupt_on_asks_people_even_where_the_policy_allows(
        url: str, db: Path, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, db, prompt(("signed_note", {"path": str(file),
                                                                "text": "sign"})),
                               session, tenant, {"default": "allow", "rules": []}))
    assert paused.status == "paused"
    [action] = asyncio.run(pending(url, session))
    assert action.tool == "signed_note" and action.apply == "langgraph:signed_note"
    assert notes(file) == []

    approved = person(url, session, "apply", "signed", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, db, session, tenant)
    assert done["output"] == "model saw: signed 'sign'"
    assert len(notes(file)) == 1


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
    staged_calls = asyncio.run(pending(url, session))
    assert sorted(a.payload["text"] for a in staged_calls) == ["a", "d"]
    assert sorted(a.id for a in staged_calls) == sorted(paused.pending)
    assert [n["text"] for n in notes(file)] == ["free b"]
    for action in staged_calls:  # the newest first: a resolve takes the session's newest
        approved = person(url, session, "apply", "ok", action.id)
        assert approved.returncode == 0, approved.stdout + approved.stderr

    done = resumed_elsewhere(url, db, session, tenant)
    assert done["status"] == "done"
    said_a, said_b, said_c, said_d = done["output"].removeprefix("model saw: ").split(" | ")
    assert (said_a, said_b, said_d) == ("noted 'a'", "noted 'free b'", "noted 'd'"), done
    assert said_c.startswith("Denied: no secrets") and said_c.endswith("Nothing was run.")
    assert sorted(n["text"] for n in notes(file)) == ["a", "d", "free b"]
    [free] = [n for n in notes(file) if n["text"] == "free b"]
    assert free["pid"] == os.getpid()  # run here at first, not again in the third process
    history = [e["event"] for e in asyncio.run(events(url, session))]
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
    [slow] = notes(file)  # done before run() said paused
    assert slow["text"] == "b" and slow["pid"] == os.getpid()
    approved = person(url, session, "apply", "ok", paused.pending[0])
    assert approved.returncode == 0, approved.stdout + approved.stderr

    done = resumed_elsewhere(url, db, session, tenant)
    assert done["output"] == "model saw: noted 'a' | noted 'b' slowly", done
    assert sorted(n["text"] for n in notes(file)) == ["a", "b"]


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
    for action in asyncio.run(pending(url, session)):  # the newest first
        approved = person(url, session, "apply", "ok", action.id)
        assert approved.returncode == 0, approved.stdout + approved.stderr

    done = resumed_elsewhere(url, db, session, tenant, sends=True)
    assert done["status"] == "done"
    seen = done["output"].removeprefix("model saw: ").split(" | ")
    assert sorted(seen) == ["noted 'a'", "noted 'd'", "noted 'free b'"], done
    assert sorted(n["text"] for n in notes(file)) == ["a", "d", "free b"]
    assert asyncio.run(interrupts()) == []


def test_staged_keeps_the_functions_schema_and_takes_the_call_id_from_langchain() -> None:
    def send(to: str, body: str, cc: list[str] | None = None) -> str:
        """Send a message.

        Args:
            to: who gets it
            body: what it says
            cc: who else
        """
        return "sent"

    tool = staged(name="send_mail_schema_test", parse_docstring=True)(send)
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
        staged(send, name="send_when_test", interrupt_on={"when": lambda request: True})


def test_a_staged_tool_outside_run_is_not_run(tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"

    async def body() -> None:
        agent = graph(InMemorySaver())
        await agent.ainvoke(prompt(("write_note", {"path": str(file), "text": "sneaky"})),
                            config={"configurable": {"thread_id": "outside"}})

    with pytest.raises(RuntimeError, match="outside"):
        asyncio.run(body())
    assert notes(file) == []


def test_a_checkpointer_of_one_process_is_refused(url: str, session: str,
                                                  tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"

    async def body() -> None:
        async with client(url) as pa:
            await run(graph(InMemorySaver()),
                      prompt(("write_note", {"path": str(file), "text": "lost"})),
                      session=session, pa=pa)

    with pytest.raises(TypeError, match="InMemorySaver"):
        asyncio.run(body())
    assert asyncio.run(pending(url, session)) == []


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
        async with client(url) as pa:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
            async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
                await run(builder.compile(checkpointer=saver), {"messages": []},
                          session=session, tenant=tenant, pa=pa)

    with pytest.raises(RuntimeError, match="no staged tool's"):
        asyncio.run(body())


def test_resume_of_a_session_with_no_paused_run_is_not_paused(url: str, db: Path,
                                                              session: str) -> None:
    async def body() -> None:
        async with client(url) as pa, opened(db) as agent:
            await adapter.resume(agent, session=session, pa=pa)

    with pytest.raises(NotPaused):
        asyncio.run(body())


def wait_until(condition: Any, message: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` (another process's doing) until it holds, or fail at ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)
