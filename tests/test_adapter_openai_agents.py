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
import os
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper, RunHooks, Runner, Tool, UserError

from pending_actions import InvalidInput
from pending_actions.adapters import openai_agents as adapter
from pending_actions.adapters.core import label
from pending_actions.adapters.openai_agents import AgentRun, run, staged
from pending_actions.procs import ROOT
from tests.support import adapters as shared
from tests.support.adapter_openai_agents import agent, calls, plain_agent, prompt
from tests.support.procs import worker_env
from tests.support.waits import wait_until_async

HANDLERS = "tests.support.adapter_openai_agents"


url, session, tenant = shared.suite_fixtures(HANDLERS, "redis-openai-agents", "oai")


def resumed_elsewhere(url: str, session: str, tenant: str) -> dict[str, Any]:
    """What came of a process that imports the agent and resumes the session's run (support's
    ``main``)."""
    return shared.outcome(shared.third(url, HANDLERS, session, tenant))


async def start(url: str, text: str, session: str, tenant: str,
                policy: dict[str, Any] | None = None, on: Agent[Any] = agent) -> AgentRun:
    async with shared.client(url) as pa:
        if policy is not None:
            await pa.set_policy(policy, tenant=tenant)
        return await run(on, text, session=session, tenant=tenant, pa=pa)


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

    paused, action, refused = asyncio.run(shared.pause_and_refuse_the_model(
        url, session, tenant, lambda pa: run(agent, ask, session=session, tenant=tenant, pa=pa)))
    shared.asked_and_refused(url, session, paused, action, refused, file)
    # the arguments as fn's schema validated them: the default filled in
    assert action.payload == {"path": str(file), "text": "hello", "tag": "plain"}
    assert action.apply == "openai-agents:write_note"
    shared.approved_applied_and_resumed(url, session, action.id, file, log,
                                        lambda: resumed_elsewhere(url, session, tenant))


def test_a_person_discards_and_the_model_sees_the_discard_as_the_sdks_rejection(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """Resumed here, with ``Runner.run``'s own options (``hooks=``, ``context=``) passed on."""
    file = tmp_path / "notes.jsonl"
    before, after = ToolCalls(), ToolCalls()

    async def pause_here() -> AgentRun:
        async with shared.client(url) as pa:
            return await run(agent, prompt("write_note", path=str(file), text="bye"),
                             session=session, tenant=tenant, pa=pa, hooks=before,
                             context={"ticket": 1})

    paused = asyncio.run(pause_here())
    assert paused.status == "paused" and before.contexts == [{"ticket": 1}]
    shared.approve(url, session, "discard", "not today", paused.pending[0])

    async def resume_here() -> AgentRun:
        async with shared.client(url) as pa:
            return await adapter.resume(agent, session=session, tenant=tenant, pa=pa,
                                        hooks=after, context={"ticket": 2})

    done = asyncio.run(resume_here())
    shown = label("write_note", {"path": str(file), "text": "bye", "tag": "plain"})
    assert done.status == "done"
    assert done.output == f"model saw: Discarded: {shown}. Reason: not today", done
    assert after.ended == []  # rejected (state.reject): the SDK invoked no tool
    assert after.contexts == [{"ticket": 2}]  # the context given to resume
    assert shared.notes(file) == []


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


def test_run_with_wait_goes_on_once_a_person_approves_in_another_process(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"

    async def body() -> AgentRun:
        async with shared.client(url) as pa:
            running = asyncio.create_task(run(
                agent, prompt("write_note", path=str(file), text="soon"), session=session,
                tenant=tenant, pa=pa, wait=60))
            async def staged() -> list[Any]:
                found = await pa.pending(session)
                assert found or not running.done(), "the run ended, never staged"
                return found

            waiting = await wait_until_async(staged, 30, "the call staged", interval_s=0.02)
            approving = await asyncio.create_subprocess_exec(
                shared.CLI, *shared.resolve_args(session, "apply", "ok", waiting[0].id),
                env=worker_env(url), cwd=ROOT)
            assert await approving.wait() == 0
            return await running

    done = asyncio.run(body())
    assert (done.status, done.output, done.pending) == ("done", "model saw: noted 'soon'", [])
    assert len(shared.notes(file)) == 1


def test_a_failed_apply_stays_pending_under_the_same_id_until_it_succeeds(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("flaky_note", path=str(file), text="retry"),
                               session, tenant))
    [action_id] = paused.pending
    shared.failed_then_applied(url, session, action_id, file,
                               lambda: resumed_elsewhere(url, session, tenant))


def test_a_worker_killed_mid_apply_leaves_it_pending_and_the_retry_writes_the_note_once(
        tmp_path: Path, session: str, tenant: str) -> None:
    """A deployment of its own: this test SIGKILLs its worker in the middle of the body. The
    resolve that started it is told the apply was interrupted, the action is pending again
    under the same id (section 4), a second approval applies it with the same idempotency key,
    and the body finds its note already written under that key."""
    file, gate = tmp_path / "notes.jsonl", tmp_path / "gate"
    with shared.deployment(tmp_path / "redis", HANDLERS, gate) as own:
        paused = asyncio.run(start(
            own.url, prompt("gated_note", path=str(file), text="once", gate=str(gate)),
            session, tenant))
        [action_id] = paused.pending
        shared.killed_mid_apply(own, session, action_id, file)
        still = resumed_elsewhere(own.url, session, tenant)
        assert still == {"status": "paused", "output": None, "pending": [action_id]}

        shared.applied_past_the_gate(own, session, action_id, file, gate, "try again")

        done = resumed_elsewhere(own.url, session, tenant)
        assert done == {"status": "done", "output": "model saw: noted 'once' past the gate",
                        "pending": []}
        assert len(shared.notes(file)) == 1
        history = [e["event"] for e in asyncio.run(shared.events(own.url, session))]
        assert history.count("applied") == 1


def test_two_resumes_at_once_continue_the_run_once(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file, log = tmp_path / "notes.jsonl", tmp_path / "model.log"
    paused = asyncio.run(start(url, prompt("write_note", log, path=str(file), text="twice?"),
                               session, tenant))
    shared.approve(url, session, "apply", "ok", paused.pending[0])
    shared.resumed_once_of_two(url, HANDLERS, session, tenant, tmp_path=tmp_path, file=file,
                               log=log)


def test_needs_approval_asks_people_even_where_the_policy_allows(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    from tests.support.adapter_openai_agents import signed_note

    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("signed_note", path=str(file), text="sign"),
                               session, tenant, shared.ALLOW))
    assert paused.status == "paused"
    [action] = asyncio.run(shared.pending(url, session))
    assert action.tool == "signed_note" and action.apply == "openai-agents:signed_note"
    assert shared.notes(file) == []
    # the SDK's flag is not a bare True (that would pause before any policy could deny it):
    # it asks the policy, which the flag makes at least an ask
    assert callable(signed_note.needs_approval)

    shared.signed_off(url, session, action.id, file,
                      lambda: resumed_elsewhere(url, session, tenant))


def test_a_call_whose_validation_differs_each_time_is_still_one_call(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    """A default made anew at each validation and a set's order (another per process): the
    call asked about before the pause, paused on, and resumed in another process is one call,
    staged once and given its result (it is told apart by the arguments the model wrote)."""
    file = tmp_path / "notes.jsonl"
    paused = asyncio.run(start(url, prompt("stamped_note", path=str(file), text="hi",
                                           tags=list("abcdefgh")),
                               session, tenant, shared.ASK))
    assert paused.status == "paused" and len(paused.pending) == 1
    shared.approve(url, session, "apply", "fine", paused.pending[0])
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: stamped 'hi'"
    assert len(shared.notes(file)) == 1


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
    assert asyncio.run(shared.pending(url, session)) == []


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
    [action] = asyncio.run(shared.pending(url, session))
    assert action.payload["path"] == str(later) and paused.pending == [action.id]
    assert [n["pid"] for n in shared.notes(now)] == [os.getpid()] and shared.notes(later) == []

    shared.approve(url, session, "apply", "fine", action.id)
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"] == "model saw: noted 'a' | noted 'b'", done
    assert len(shared.notes(now)) == 1 and len(shared.notes(later)) == 1


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
    [action] = asyncio.run(shared.pending(url, session))
    assert paused.pending == [action.id] and action.payload["text"] == "valid"

    shared.approve(url, session, "apply", "fine", action.id)
    done = resumed_elsewhere(url, session, tenant)
    assert done["output"].startswith("model saw: "), done
    assert sorted(done["output"].removeprefix("model saw: ").split(" | ")) == [
        "An error occurred while running the tool. Please try again.",
        "Invalid arguments for write_note: not a JSON object of its parameters. "
        "Nothing was run.",
        "noted 'valid'"]
    assert len(shared.notes(file)) == 1
    # answering the bad calls before the pause asked the model nothing
    assert shared.lines(log) == 2


def test_a_tool_the_sdk_pauses_that_is_not_staged_is_refused_by_name(
        url: str, session: str, tenant: str, tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    with pytest.raises(InvalidInput, match="'plain_note', which is not a staged tool"):
        asyncio.run(start(url, prompt("plain_note", path=str(file), text="x"), session,
                          tenant, on=plain_agent))
    assert asyncio.run(shared.pending(url, session)) == []
    assert shared.notes(file) == []


def test_staged_is_the_sdks_function_tool_with_the_functions_schema() -> None:
    tool = staged(name="send_mail_schema_test")(shared.send)
    assert isinstance(tool, FunctionTool)
    assert tool.name == "send_mail_schema_test"
    assert tool.description == "Send a message."
    schema = tool.params_json_schema
    assert schema["properties"]["to"] == {"description": "who gets it", "title": "To",
                                          "type": "string"}
    assert set(schema["required"]) == {"to", "body", "cc"}  # the SDK's strict mode
    assert tool.strict_json_schema

    with pytest.raises(TypeError, match="name_override"):
        staged(name_override="x")(shared.send)
    per_call: Any = lambda *_: True  # noqa: E731 (the SDK's per-call form, refused)
    with pytest.raises(TypeError, match="a bool"):
        staged(name="send_mail_callable", needs_approval=per_call)(shared.send)

    def with_context(ctx: RunContextWrapper[Any], to: str) -> str:
        return to

    with pytest.raises(TypeError, match="RunContextWrapper"):
        staged(name="send_mail_with_context")(with_context)


def test_a_staged_tool_outside_run_is_not_run(tmp_path: Path) -> None:
    file = tmp_path / "notes.jsonl"
    with pytest.raises(UserError, match="outside") as raised:  # the SDK wraps what tools raise
        asyncio.run(Runner.run(agent, prompt("write_note", path=str(file), text="sneaky")))
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert shared.notes(file) == []


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
    assert asyncio.run(shared.pending(url, session)) == []
    assert shared.notes(file) == []


def test_resume_of_a_session_with_no_paused_run_is_not_paused(url: str, session: str) -> None:
    shared.resumes_nothing(url, lambda pa: adapter.resume(agent, session=session, pa=pa))

