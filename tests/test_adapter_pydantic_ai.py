"""CONTRACT section 9, Pydantic AI: ``pending_actions.adapters.pydantic_ai`` drives a plain
``Agent`` with Pydantic AI's own offline ``FunctionModel`` (tests/support/adapter_pydantic_ai.py)
against a real Redis and real worker processes. A call the policy asks about ends the run with
``DeferredToolRequests`` (``paused``); a person approves it from another process (the CLI); a
third process resumes the run, which gets the handler's result as the tool's result. Also:
discard, deny, allow, a failed apply, a worker SIGKILLed mid-apply, two resumes at once, and
``requires_approval`` over a policy that allows."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import DeferredToolRequests

from pending_actions.adapters import pydantic_ai as adapter
from pending_actions.adapters.pydantic_ai import AgentRun, run, staged
from tests.support import adapters as shared
from tests.support.adapter_pydantic_ai import agent, prompt, prompt_calls, signed_note

HANDLERS = "tests.support.adapter_pydantic_ai"


url, session, tenant = shared.suite_fixtures(HANDLERS, "redis-pydantic-ai", "pai")


def resumed_elsewhere(url: str, session: str, tenant: str) -> dict[str, Any]:
    """What came of a process that imports the agent and resumes the session's run (support's
    ``main``)."""
    return shared.outcome(shared.third(url, HANDLERS, session, tenant))


async def start(url: str, text: str, session: str, tenant: str,
                policy: dict[str, Any] | None = None) -> AgentRun:
    async with shared.client(url) as pa:
        if policy is not None:
            await pa.set_policy(policy, tenant=tenant)
        return await run(agent, text, session=session, tenant=tenant, pa=pa)


def model_resolves(url: str, session: str) -> Any:
    """The model's own resolve (no approver): what a policy's ``ask`` refuses."""
    async def body() -> Any:
        async with shared.client(url) as pa:
            return await pa.resolve(session=session, action="apply", reason="looks fine")
    return asyncio.run(body())


def test_ask_pauses_the_model_is_refused_a_person_approves_and_a_third_process_resumes(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    ask = prompt("write_note", log, path=str(file), text="hello")

    paused, action, refused = asyncio.run(shared.pause_and_refuse_the_model(
        url, session, tenant, lambda pa: run(agent, ask, session=session, tenant=tenant, pa=pa)))
    shared.asked_and_refused(url, session, paused, action, refused, file)
    assert action.payload == {"path": str(file), "text": "hello"}
    assert action.apply == "pydantic-ai:write_note"
    shared.approved_applied_and_resumed(url, session, action.id, file, log,
                                        lambda: resumed_elsewhere(url, session, tenant))


def test_a_person_discards_and_the_model_sees_the_discard(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("write_note", path=str(file), text="bye"), session,
                               tenant))
    assert paused.status == "paused"
    shared.discarded(url, session, paused.pending[0], file, {"path": str(file), "text": "bye"},
                     lambda: resumed_elsewhere(url, session, tenant))


def test_deny_answers_the_model_with_the_reason_and_the_run_goes_on(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    done = asyncio.run(start(url, prompt("write_note", path=str(file), text="x"), session,
                             tenant, shared.READ_ONLY))
    assert done.status == "done" and done.pending == []
    assert done.output.startswith("model saw: Denied: notes are read-only today"), done.output
    shared.denied(url, session, file)


def test_allow_runs_the_tool_at_once_in_the_calling_process(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    done = asyncio.run(start(url, prompt("write_note", path=str(file), text="now"), session,
                             tenant, shared.ALLOW))
    assert (done.status, done.output, done.pending) == ("done", "model saw: noted 'now'", [])
    shared.ran_here(url, session, file)


def test_a_failed_apply_stays_pending_under_the_same_id_until_it_succeeds(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("flaky_note", path=str(file), text="retry"),
                               session, tenant))
    [action_id] = paused.pending
    shared.failed_then_applied(url, session, action_id, file,
                               lambda: resumed_elsewhere(url, session, tenant))


def test_a_worker_killed_mid_apply_is_recovered_and_the_note_is_written_once(
        tmp_path: Path, session: str, tenant: str) -> None:
    """A deployment of its own: this test kills its worker."""
    file, gate = tmp_path / "notes.jsonl", tmp_path / "gate"
    with shared.deployment(tmp_path / "redis", HANDLERS, gate) as own:
        paused = asyncio.run(start(
            own.url,
            prompt("gated_note", path=str(file), text="once", gate=str(gate)),
            session, tenant))
        [action_id] = paused.pending
        shared.killed_mid_apply(own, session, action_id, file)
        assert resumed_elsewhere(own.url, session, tenant)["status"] == "paused"

        shared.applied_past_the_gate(own, session, action_id, file, gate)

        done = resumed_elsewhere(own.url, session, tenant)
        assert done == {"status": "done", "output": "model saw: noted 'once' past the gate",
                        "pending": []}
        assert len(shared.notes(file)) == 1


def test_two_resumes_at_once_continue_the_run_once(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    paused = asyncio.run(start(url, prompt("write_note", log, path=str(file), text="twice?"),
                               session, tenant))
    shared.approve(url, session, "apply", "ok", paused.pending[0])
    shared.resumed_once_of_two(url, HANDLERS, session, tenant, tmp_path=tmp_path, file=file,
                               log=log)


def test_requires_approval_asks_people_even_where_the_policy_allows(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("signed_note", path=str(file), text="sign"),
                               session, tenant, shared.ALLOW))
    assert paused.status == "paused"
    [action] = asyncio.run(shared.pending(url, session))
    assert action.tool == "signed_note" and action.apply == "pydantic-ai:signed_note"
    assert action.policy is not None and action.policy["decision"] == "ask"
    assert model_resolves(url, session).text.startswith("Needs approval:")  # the store holds it
    assert shared.notes(file) == []
    # not Pydantic AI's own flag, which would defer the call before any policy decided it
    assert not signed_note.requires_approval and signed_note.tool_def.kind == "function"

    shared.signed_off(url, session, action.id, file,
                      lambda: resumed_elsewhere(url, session, tenant))


def test_a_call_that_ran_before_the_pause_is_not_run_again_on_resume(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """One response, two calls: the allowed one runs here at once, the other waits for people;
    on resume only the waiting one gets its result, and the model sees both."""
    ran, signed = tmp_path / "ran.jsonl", tmp_path / "signed.jsonl"
    both = prompt_calls(("write_note", {"path": str(ran), "text": "a"}),
                        ("signed_note", {"path": str(signed), "text": "b"}))
    paused = asyncio.run(start(url, both, session, tenant, shared.ALLOW))
    [action] = asyncio.run(shared.pending(url, session))
    assert paused.pending == [action.id] and action.tool == "signed_note"
    assert [n["pid"] for n in shared.notes(ran)] == [os.getpid()] and shared.notes(signed) == []

    shared.approve(url, session, "apply", "ok", action.id)
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: signed 'b' | noted 'a'", done
    assert len(shared.notes(ran)) == 1 and len(shared.notes(signed)) == 1


def test_staged_keeps_the_functions_schema_and_adds_deferred_requests_to_the_output() -> None:
    tool = staged(name="send_mail_schema_test")(shared.send)
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
    assert shared.notes(file) == []


def test_resume_of_a_session_with_no_paused_run_is_not_paused(url: str, session: str) -> None:
    shared.resumes_nothing(url, lambda pa: adapter.resume(agent, session=session, pa=pa))

