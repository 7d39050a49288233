"""CONTRACT section 9, Pydantic AI: ``pending_actions.adapters.pydantic_ai`` drives a plain
``Agent`` with Pydantic AI's own offline ``FunctionModel`` (tests/support/adapter_pydantic_ai.py)
against a real Redis and real worker processes. A call the policy asks about ends the run with
``DeferredToolRequests`` (``paused``); a person approves it from another process (the CLI); a
third process resumes the run, which gets the handler's result as the tool's result. Also:
discard, deny, allow, a failed apply, a worker SIGKILLed mid-apply, two resumes at once, and
``requires_approval`` over a policy that allows."""

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
from pydantic_ai import DeferredToolRequests

from pending_actions import AsyncPendingActions, NotPaused
from pending_actions.adapters import pydantic_ai as adapter
from pending_actions.adapters.core import label
from pending_actions.adapters.pydantic_ai import AgentRun, run, staged
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from tests.support.adapter_pydantic_ai import agent, notes, prompt, prompt_calls, signed_note
from tests.support.faults import FAST
from tests.support.procs import Worker, worker_env

HANDLERS = "tests.support.adapter_pydantic_ai"
CLI = str(Path(sys.executable).parent / "pending-actions")
THIRD = ("import sys; from tests.support.adapter_pydantic_ai import main; "
         "main(sys.argv[1:])")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of its own and a worker that imports the staged tools."""
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-pydantic-ai")).start()
    worker = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
    yield server.url
    worker.stop()
    server.stop()


@pytest.fixture
def session() -> str:
    return f"pai-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tenant() -> str:
    """Each test its own tenant, so that its policy is its own."""
    return f"pai-{uuid.uuid4().hex[:8]}"


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
                policy: dict[str, Any] | None = None) -> AgentRun:
    async with client(url) as pa:
        if policy is not None:
            await pa.set_policy(policy, tenant=tenant)
        return await run(agent, text, session=session, tenant=tenant, pa=pa)


async def pending(url: str, session: str) -> list[Any]:
    async with client(url) as pa:
        return await pa.pending(session)


async def events(url: str, session: str) -> list[dict[str, Any]]:
    async with client(url) as pa:
        return await pa.history(session)


def model_resolves(url: str, session: str) -> Any:
    """The model's own resolve (no approver): what a policy's ``ask`` refuses."""
    async def body() -> Any:
        async with client(url) as pa:
            return await pa.resolve(session=session, action="apply", reason="looks fine")
    return asyncio.run(body())


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


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
    assert action.payload == {"path": str(file), "text": "hello"}
    assert action.label == label("write_note", action.payload)  # the name, the values
    assert action.label.startswith('write_note(path="') and 'text="hello"' in action.label
    assert action.apply == "pydantic-ai:write_note" and action.reject is None
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
    assert len(notes(file)) == 1
    assert lines(log) == 2  # the turn that called the tool, the turn that saw its result
    applied = [e for e in asyncio.run(events(url, session)) if e["event"] == "applied"]
    assert [e["id"] for e in applied] == [action.id]
    assert "alice" in json.dumps(applied[0])
    # the run is over: nothing to resume any more
    assert resumed_elsewhere(url, session, tenant)["error"] == "NotPaused"


def test_a_person_discards_and_the_model_sees_the_discard(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("write_note", path=str(file), text="bye"), session,
                               tenant))
    assert paused.status == "paused"
    discarded = person(url, session, "discard", "not today", paused.pending[0])
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr

    done = resumed_elsewhere(url, session, tenant)
    shown = label("write_note", {"path": str(file), "text": "bye"})
    assert done["status"] == "done"
    assert done["output"] == f"model saw: Discarded: {shown}. Reason: not today", done
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


def test_a_worker_killed_mid_apply_is_recovered_and_the_note_is_written_once(
        tmp_path: Path, session: str, tenant: str) -> None:
    """A deployment of its own: this test kills its worker."""
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
        first.kill()  # SIGKILL, the whole worker: its resolver too
        # a new worker's resolver finds the lease ended and ends the attempt with it
        second = Worker(server.url, handlers=HANDLERS, overrides=FAST).start()
        out, err = resolving.communicate(timeout=90)
        assert resolving.returncode == 1 and "interrupted" in out, out + err
        [back] = asyncio.run(pending(server.url, session))
        assert (back.id, back.attempts) == (action_id, 1)  # pending again, the same id
        assert resumed_elsewhere(server.url, session, tenant)["status"] == "paused"

        gate.write_text("open")
        again = person(server.url, session, "apply", "go again", action_id)
        assert again.returncode == 0, again.stdout + again.stderr
        assert lines(started) == 2  # the body ran twice...
        [note] = notes(file)  # ...and wrote once: the second found its key written
        assert note["key"] == action_id

        done = resumed_elsewhere(server.url, session, tenant)
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


def test_requires_approval_asks_people_even_where_the_policy_allows(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("signed_note", path=str(file), text="sign"),
                               session, tenant, {"default": "allow", "rules": []}))
    assert paused.status == "paused"
    [action] = asyncio.run(pending(url, session))
    assert action.tool == "signed_note" and action.apply == "pydantic-ai:signed_note"
    assert action.policy is not None and action.policy["decision"] == "ask"
    assert model_resolves(url, session).text.startswith("Needs approval:")  # the store holds it
    assert notes(file) == []
    # not Pydantic AI's own flag, which would defer the call before any policy decided it
    assert not signed_note.requires_approval and signed_note.tool_def.kind == "function"

    approved = person(url, session, "apply", "signed", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: signed 'sign'"
    assert len(notes(file)) == 1


def test_a_call_that_ran_before_the_pause_is_not_run_again_on_resume(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """One response, two calls: the allowed one runs here at once, the other waits for people;
    on resume only the waiting one gets its result, and the model sees both."""
    ran, signed = tmp_path / "ran.jsonl", tmp_path / "signed.jsonl"
    both = prompt_calls(("write_note", {"path": str(ran), "text": "a"}),
                        ("signed_note", {"path": str(signed), "text": "b"}))
    paused = asyncio.run(start(url, both, session, tenant, {"default": "allow", "rules": []}))
    [action] = asyncio.run(pending(url, session))
    assert paused.pending == [action.id] and action.tool == "signed_note"
    assert [n["pid"] for n in notes(ran)] == [os.getpid()] and notes(signed) == []

    approved = person(url, session, "apply", "ok", action.id)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: signed 'b' | noted 'a'", done
    assert len(notes(ran)) == 1 and len(notes(signed)) == 1


def test_staged_keeps_the_functions_schema_and_adds_deferred_requests_to_the_output() -> None:
    def send(to: str, body: str, cc: list[str] | None = None) -> str:
        """Send a message.

        Args:
            to: who gets it
            body: what it says
            cc: who else
        """
        return "sent"

    tool = staged(name="send_mail_schema_test")(send)
    definition = tool.tool_def
    assert definition.name == "send_mail_schema_test"
    assert definition.description == "Send a message."
    schema = definition.parameters_json_schema
    assert schema["required"] == ["to", "body"]
    assert schema["properties"]["to"] == {"description": "who gets it", "type": "string"}
    assert "ctx" not in schema["properties"]
    assert adapter._output_type(agent, None) == [str, DeferredToolRequests]
    assert adapter._output_type(agent, [int, DeferredToolRequests]) == [int, DeferredToolRequests]


def test_a_staged_tool_outside_run_is_not_run(tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    with pytest.raises(RuntimeError, match="outside"):
        agent.run_sync(prompt("write_note", path=str(file), text="sneaky"))
    assert notes(file) == []


def test_resume_of_a_session_with_no_paused_run_is_not_paused(url: str, session: str) -> None:
    async def body() -> None:
        async with client(url) as pa:
            await adapter.resume(agent, session=session, pa=pa)

    with pytest.raises(NotPaused):
        asyncio.run(body())


def wait_until(condition: Any, message: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` (another process's doing) until it holds, or fail at ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)
