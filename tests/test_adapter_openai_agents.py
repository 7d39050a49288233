"""CONTRACT section 9, the OpenAI Agents SDK: ``pending_actions.adapters.openai_agents`` drives an
``Agent`` with an offline model built on the SDK's own ``Model`` interface
(tests/support/adapter_openai_agents.py) against a real Redis and real worker processes. A call
the policy asks about pauses the run with the SDK's own interruptions (``paused``); a person
approves it from another process (the CLI); a third process restores the SDK's ``RunState`` and
resumes the run, which gets the handler's result as the tool's result. Also: discard, deny,
allow, a failed apply, a worker SIGKILLed mid-apply, two resumes at once, ``needs_approval``
over a policy that allows, a turn mixing calls, arguments the SDK cannot parse, and a tool the
SDK pauses that is not staged."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper, RunHooks, Runner, Tool, UserError

from pending_actions import AsyncPendingActions, InvalidInput, NotPaused
from pending_actions.adapters import openai_agents as adapter
from pending_actions.adapters.core import label
from pending_actions.adapters.openai_agents import AgentRun, run, staged
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from tests.support.adapter_openai_agents import agent, calls, notes, plain_agent, prompt
from tests.support.faults import FAST
from tests.support.procs import Worker, worker_env

HANDLERS = "tests.support.adapter_openai_agents"
CLI = str(Path(sys.executable).parent / "pending-actions")
THIRD = ("import sys; from tests.support.adapter_openai_agents import main; "
         "main(sys.argv[1:])")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of its own and a worker that imports the staged tools."""
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-openai-agents")).start()
    worker = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
    yield server.url
    worker.stop()
    server.stop()


@pytest.fixture
def session() -> str:
    return f"oai-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tenant() -> str:
    """Each test its own tenant, so that its policy is its own."""
    return f"oai-{uuid.uuid4().hex[:8]}"


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


def third(url: str, session: str, tenant: str, *barrier: Path) -> subprocess.Popen[str]:
    """A process that imports the agent and resumes the session's run (support's ``main``)."""
    return subprocess.Popen([sys.executable, "-c", THIRD, session, tenant,
                             *map(str, barrier)], env=worker_env(url), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def resumed_elsewhere(url: str, session: str, tenant: str) -> dict[str, Any]:
    return outcome(third(url, session, tenant))


async def start(url: str, text: str, session: str, tenant: str,
                policy: dict[str, Any] | None = None, on: Agent[Any] = agent) -> AgentRun:
    async with client(url) as pa:
        if policy is not None:
            await pa.set_policy(policy, tenant=tenant)
        return await run(on, text, session=session, tenant=tenant, pa=pa)


async def pending(url: str, session: str) -> list[Any]:
    async with client(url) as pa:
        return await pa.pending(session)


async def events(url: str, session: str) -> list[dict[str, Any]]:
    async with client(url) as pa:
        return await pa.history(session)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


class ToolCalls(RunHooks[Any]):
    """The SDK's own record of a run: the tools it invoked, the context each model turn had."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, object]] = []
        self.contexts: list[Any] = []

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool,
                          result: object) -> None:
        self.ended.append((tool.name, result))

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Agent[Any],
                           system_prompt: str | None, input_items: list[Any]) -> None:
        self.contexts.append(context.context)


def test_ask_pauses_the_model_is_refused_a_person_approves_and_a_third_process_resumes(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    ask = prompt("write_note", log, path=str(file), text="hello")

    async def pause_and_refuse_the_model() -> tuple[AgentRun, Any, Any]:
        async with client(url) as pa:
            await pa.set_policy({"default": "ask", "rules": []}, tenant=tenant)
            paused = await run(agent, ask, session=session, tenant=tenant, pa=pa)
            [action] = await pa.pending(session)
            refused = await pa.resolve(session=session, action="apply",
                                       reason="the model approves itself")
            return paused, action, refused

    paused, action, refused = asyncio.run(pause_and_refuse_the_model())
    assert (paused.status, paused.output, paused.pending) == ("paused", None, [action.id])
    assert paused.session == session
    assert action.tool == "write_note"
    # the arguments as fn's schema validated them: the default filled in
    assert action.payload == {"path": str(file), "text": "hello", "tag": "plain"}
    assert action.label == label("write_note", action.payload)  # the name, the values
    assert action.label.startswith('write_note(path="') and 'text="hello"' in action.label
    assert action.apply == "openai-agents:write_note" and action.reject is None
    assert action.policy is not None and action.policy["decision"] == "ask"
    assert refused.is_error and refused.text.startswith("Needs approval:"), refused.text
    assert [a.id for a in asyncio.run(pending(url, session))] == [action.id]
    assert notes(file) == []

    approved = person(url, session, "apply", "fine by me", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    [note] = notes(file)
    assert note["text"] == "hello" and note["pid"] != os.getpid()  # a worker applied it
    assert note["key"] == action.id  # the idempotency key reached the body

    done = resumed_elsewhere(url, session, tenant)
    assert done == {"status": "done", "output": "model saw: noted 'hello'", "pending": []}
    assert len(notes(file)) == 1  # the approved call gave the worker's result: fn did not rerun
    assert lines(log) == 2  # the turn that called the tool, the turn that saw its result
    applied = [e for e in asyncio.run(events(url, session)) if e["event"] == "applied"]
    assert [e["id"] for e in applied] == [action.id]
    assert "alice" in json.dumps(applied[0])
    # the run is over: nothing to resume any more
    assert resumed_elsewhere(url, session, tenant)["error"] == "NotPaused"


def test_a_person_discards_and_the_model_sees_the_discard_as_the_sdks_rejection(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """Resumed here, with ``Runner.run``'s own options (``hooks=``, ``context=``) passed on."""
    file = tmp_path / "notes.jsonl"
    before, after = ToolCalls(), ToolCalls()

    async def pause_here() -> AgentRun:
        async with client(url) as pa:
            return await run(agent, prompt("write_note", path=str(file), text="bye"),
                             session=session, tenant=tenant, pa=pa, hooks=before,
                             context={"ticket": 1})

    paused = asyncio.run(pause_here())
    assert paused.status == "paused" and before.contexts == [{"ticket": 1}]
    discarded = person(url, session, "discard", "not today", paused.pending[0])
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr

    async def resume_here() -> AgentRun:
        async with client(url) as pa:
            return await adapter.resume(agent, session=session, tenant=tenant, pa=pa,
                                        hooks=after, context={"ticket": 2})

    done = asyncio.run(resume_here())
    shown = label("write_note", {"path": str(file), "text": "bye", "tag": "plain"})
    assert done.status == "done"
    assert done.output == f"model saw: Discarded: {shown}. Reason: not today", done
    assert after.ended == []  # rejected (state.reject): the SDK invoked no tool
    assert after.contexts == [{"ticket": 2}]  # the context given to resume
    assert notes(file) == []


def test_deny_answers_the_model_with_the_reason_and_the_run_goes_on(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    policy = {"default": "allow", "rules": [
        {"name": "read-only", "match": {"tool": "write_note"}, "decision": "deny",
         "reason": "notes are read-only today"}]}
    done = asyncio.run(start(url, prompt("write_note", path=str(file), text="x"), session,
                             tenant, policy))
    assert done.status == "done" and done.pending == []
    assert done.output.startswith("model saw: Denied: notes are read-only today"), done.output
    assert asyncio.run(pending(url, session)) == []
    assert "denied" in [e["event"] for e in asyncio.run(events(url, session))]
    assert notes(file) == []


def test_allow_runs_the_tool_at_once_in_the_calling_process(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    done = asyncio.run(start(url, prompt("write_note", path=str(file), text="now"), session,
                             tenant, {"default": "allow", "rules": []}))
    assert (done.status, done.output, done.pending) == ("done", "model saw: noted 'now'", [])
    [note] = notes(file)
    assert note["pid"] == os.getpid() and note["key"] is None  # here, not in a worker
    assert asyncio.run(pending(url, session)) == []


def test_run_with_wait_goes_on_once_a_person_approves_in_another_process(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"

    async def body() -> AgentRun:
        async with client(url) as pa:
            running = asyncio.create_task(run(
                agent, prompt("write_note", path=str(file), text="soon"), session=session,
                tenant=tenant, pa=pa, wait=60))
            deadline = time.monotonic() + 30
            while not (waiting := await pa.pending(session)):
                assert time.monotonic() < deadline and not running.done(), "never staged"
                await asyncio.sleep(0.02)
            approving = await asyncio.create_subprocess_exec(
                CLI, "resolve", "--session", session, "--action", "apply", "--reason", "ok",
                "--approver", "alice", "--expect-id", waiting[0].id, "--timeout", "60",
                env=worker_env(url), cwd=ROOT)
            assert await approving.wait() == 0
            return await running

    done = asyncio.run(body())
    assert (done.status, done.output, done.pending) == ("done", "model saw: noted 'soon'", [])
    assert len(notes(file)) == 1


def test_a_failed_apply_stays_pending_under_the_same_id_until_it_succeeds(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("flaky_note", path=str(file), text="retry"),
                               session, tenant))
    [action_id] = paused.pending

    failed = person(url, session, "apply", "go", action_id)
    assert failed.returncode == 1 and "the disk is full" in failed.stdout, failed.stdout
    [still] = asyncio.run(pending(url, session))
    assert still.id == action_id and still.attempts == 1
    again = resumed_elsewhere(url, session, tenant)
    assert again == {"status": "paused", "output": None, "pending": [action_id]}

    applied = person(url, session, "apply", "go again", action_id)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done == {"status": "done", "output": "model saw: noted 'retry' at last",
                    "pending": []}
    assert len(notes(file)) == 1


def test_a_worker_killed_mid_apply_leaves_it_pending_and_the_retry_writes_the_note_once(
        tmp_path: Path, session: str, tenant: str) -> None:
    """A deployment of its own: this test SIGKILLs its worker in the middle of the body. The
    resolve that started it is told the apply was interrupted, the action is pending again
    under the same id (section 4), a second approval applies it with the same idempotency key,
    and the body finds its note already written under that key."""
    file, gate = tmp_path / "notes.jsonl", tmp_path / "gate"
    started = Path(str(file) + ".started")
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    first = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
    second: Worker | None = None
    try:
        paused = asyncio.run(start(
            server.url, prompt("gated_note", path=str(file), text="once", gate=str(gate)),
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
        first.kill()  # SIGKILL, mid-apply
        second = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
        out, err = resolving.communicate(timeout=90)
        assert resolving.returncode == 1 and "interrupted" in out, out + err
        [again] = asyncio.run(pending(server.url, session))
        assert (again.id, again.attempts) == (action_id, 1)
        still = resumed_elsewhere(server.url, session, tenant)
        assert still == {"status": "paused", "output": None, "pending": [action_id]}

        gate.write_text("open")
        retried = person(server.url, session, "apply", "try again", action_id)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        assert lines(started) == 2  # the body ran twice
        [note] = notes(file)  # the second attempt found it written under the same key
        assert note["key"] == action_id

        done = resumed_elsewhere(server.url, session, tenant)
        assert done == {"status": "done", "output": "model saw: noted 'once' past the gate",
                        "pending": []}
        assert len(notes(file)) == 1
        history = [e["event"] for e in asyncio.run(events(server.url, session))]
        assert history.count("applied") == 1
    finally:
        gate.write_text("open")
        if second is not None:
            second.stop()
        first.kill()
        server.stop()


def test_two_resumes_at_once_continue_the_run_once(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    paused = asyncio.run(start(url, prompt("write_note", log, path=str(file), text="twice?"),
                               session, tenant))
    approved = person(url, session, "apply", "ok", paused.pending[0])
    assert approved.returncode == 0, approved.stdout + approved.stderr

    go = tmp_path / "go"
    ready = [tmp_path / "ready-a", tmp_path / "ready-b"]
    procs = [third(url, session, tenant, r, go) for r in ready]
    wait_until(lambda: all(r.exists() for r in ready), "the resumes never got ready")
    go.write_text("go")
    answers = sorted((outcome(p) for p in procs), key=lambda a: "error" in a)
    assert answers[0] == {"status": "done", "output": "model saw: noted 'twice?'",
                          "pending": []}
    assert answers[1]["error"] == "NotPaused", answers
    assert lines(log) == 2  # the model went on once
    assert len(notes(file)) == 1


def test_needs_approval_asks_people_even_where_the_policy_allows(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    from tests.support.adapter_openai_agents import signed_note

    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("signed_note", path=str(file), text="sign"),
                               session, tenant, {"default": "allow", "rules": []}))
    assert paused.status == "paused"
    [action] = asyncio.run(pending(url, session))
    assert action.tool == "signed_note" and action.apply == "openai-agents:signed_note"
    assert notes(file) == []
    # the SDK's flag is not a bare True (that would pause before any policy could deny it):
    # it asks the policy, which the flag makes at least an ask
    assert callable(signed_note.needs_approval)

    approved = person(url, session, "apply", "signed", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: signed 'sign'"
    assert len(notes(file)) == 1


def test_a_call_whose_validation_differs_each_time_is_still_one_call(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """A default made anew at each validation and a set's order (another per process): the
    call asked about before the pause, paused on, and resumed in another process is one call,
    staged once and given its result (it is told apart by the arguments the model wrote)."""
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("stamped_note", path=str(file), text="hi",
                                           tags=list("abcdefgh")),
                               session, tenant, {"default": "ask", "rules": []}))
    assert paused.status == "paused" and len(paused.pending) == 1
    approved = person(url, session, "apply", "fine", paused.pending[0])
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: stamped 'hi'"
    assert len(notes(file)) == 1


def test_needs_approval_still_yields_to_a_deny_rule(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    policy = {"default": "allow", "rules": [
        {"name": "no-signing", "match": {"tool": "signed_note"}, "decision": "deny",
         "reason": "nobody signs today"}]}
    done = asyncio.run(start(url, prompt("signed_note", path=str(file), text="sign"),
                             session, tenant, policy))
    assert done.status == "done"
    assert done.output.startswith("model saw: Denied: nobody signs today"), done.output
    assert asyncio.run(pending(url, session)) == []


def test_one_turn_allowed_and_asked_the_allowed_runs_now_the_asked_waits(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    now, later = tmp_path / "now.jsonl", tmp_path / "later.jsonl"
    policy = {"default": "ask", "rules": [
        {"name": "tagged", "match": {"tool": "write_note", "payload": {"tag": "ok"}},
         "decision": "allow"}]}
    both = calls([("write_note", {"path": str(now), "text": "a", "tag": "ok"}),
                  ("write_note", {"path": str(later), "text": "b"})])
    paused = asyncio.run(start(url, both, session, tenant, policy))
    assert paused.status == "paused"
    [action] = asyncio.run(pending(url, session))
    assert action.payload["path"] == str(later) and paused.pending == [action.id]
    assert [n["pid"] for n in notes(now)] == [os.getpid()] and notes(later) == []

    approved = person(url, session, "apply", "fine", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: noted 'a' | noted 'b'", done
    assert len(notes(now)) == 1 and len(notes(later)) == 1


def test_arguments_that_do_not_fit_are_answered_and_nothing_is_staged_for_them(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """The SDK pauses a call whose arguments are not a JSON object without asking the tool's
    ``needs_approval``: the adapter answers it with the error. Arguments that are an object but
    not ``fn``'s parameters get the SDK's own error (its invocation validates them, and ``fn``
    does not run). Only the valid call waits for people."""
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    three = calls([("write_note", '"not an object"'),
                   ("write_note", {"path": str(file)}),  # no text: not fn's parameters
                   ("write_note", {"path": str(file), "text": "valid"})], log)
    paused = asyncio.run(start(url, three, session, tenant))
    [action] = asyncio.run(pending(url, session))
    assert paused.pending == [action.id] and action.payload["text"] == "valid"

    approved = person(url, session, "apply", "fine", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"].startswith("model saw: "), done
    assert sorted(done["output"].removeprefix("model saw: ").split(" | ")) == [
        "An error occurred while running the tool. Please try again.",
        "Invalid arguments for write_note: not a JSON object of its parameters. "
        "Nothing was run.",
        "noted 'valid'"]
    assert len(notes(file)) == 1
    assert lines(log) == 2  # answering the bad calls before the pause asked the model nothing


def test_a_tool_the_sdk_pauses_that_is_not_staged_is_refused_by_name(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    with pytest.raises(InvalidInput, match="'plain_note', which is not a staged tool"):
        asyncio.run(start(url, prompt("plain_note", path=str(file), text="x"), session,
                          tenant, on=plain_agent))
    assert asyncio.run(pending(url, session)) == []
    assert notes(file) == []


def test_staged_is_the_sdks_function_tool_with_the_functions_schema() -> None:
    def send(to: str, body: str, cc: list[str] | None = None) -> str:
        """Send a message.

        Args:
            to: who gets it
            body: what it says
            cc: who else
        """
        return "sent"

    tool = staged(name="send_mail_schema_test")(send)
    assert isinstance(tool, FunctionTool)
    assert tool.name == "send_mail_schema_test"
    assert tool.description == "Send a message."
    schema = tool.params_json_schema
    assert schema["properties"]["to"] == {"description": "who gets it", "title": "To",
                                          "type": "string"}
    assert set(schema["required"]) == {"to", "body", "cc"}  # the SDK's strict mode
    assert tool.strict_json_schema

    with pytest.raises(TypeError, match="name_override"):
        staged(name_override="x")(send)
    per_call: Any = lambda *_: True  # noqa: E731 (the SDK's per-call form, refused)
    with pytest.raises(TypeError, match="a bool"):
        staged(name="send_mail_callable", needs_approval=per_call)(send)

    def with_context(ctx: RunContextWrapper[Any], to: str) -> str:
        return to

    with pytest.raises(TypeError, match="RunContextWrapper"):
        staged(name="send_mail_with_context")(with_context)


def test_a_staged_tool_outside_run_is_not_run(tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    with pytest.raises(UserError, match="outside") as raised:  # the SDK wraps what tools raise
        asyncio.run(Runner.run(agent, prompt("write_note", path=str(file), text="sneaky")))
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert notes(file) == []


def test_our_errors_inside_the_sdks_tool_pipeline_reach_the_caller_as_themselves(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """A payload over ``max_payload_bytes`` is refused by the stage that records a deny, made
    while the call is decided, inside the SDK's tool pipeline, which wraps it in its
    ``UserError``: ``run`` raises ours."""
    file = tmp_path / "notes.jsonl"
    deny = {"default": "deny", "rules": []}
    with pytest.raises(InvalidInput, match="payload"):
        asyncio.run(start(url, prompt("write_note", path=str(file), text="x" * 1_100_000),
                          session, tenant, deny))
    assert asyncio.run(pending(url, session)) == []
    assert notes(file) == []


def test_resume_of_a_session_with_no_paused_run_is_not_paused(url: str, session: str) -> None:
    async def body() -> None:
        async with client(url) as pa:
            await adapter.resume(agent, session=session, pa=pa)

    with pytest.raises(NotPaused):
        asyncio.run(body())


def wait_until(condition: Callable[[], bool], message: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` (another process's doing) until it holds, or fail at ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)
