"""The OpenAI Agents SDK inside pending actions (extra ``openai-agents``): ``staged`` makes the
SDK's own ``FunctionTool`` whose calls the tenant's policy decides; ``run`` and ``resume`` drive
an ``Agent`` with ``Runner.run`` so that a call people must decide pauses the run with the SDK's
own interruptions (``RunResult.interruptions``) and continues, in any process, from the SDK's
own ``RunState``.

How the SDK's pieces are used:

- A staged tool is built by ``function_tool(fn)`` (so the schema the model sees is ``fn``'s own
  signature and docstring) and then wrapped: its ``needs_approval`` is an async callable asking
  ``core.current().decide(...)`` and answering True for ``ask`` only, so the SDK interrupts the
  run on exactly the calls people decide; its ``on_invoke_tool`` answers what was decided: the
  call's outcome on resume (the handler's result, the discard's text), the refusal for ``deny``,
  and for ``allow`` the SDK's own invocation of ``fn`` here (validation, failure handling).
- The state kept in Redis is ``RunResult.to_state().to_string()``; the continuation is
  ``RunState.from_string(agent, state)``, ``state.approve(item)`` for an applied call (the SDK
  then invokes the tool, whose ``on_invoke_tool`` returns the handler's result: ``fn`` does not
  run again) or ``state.reject(item, rejection_message=text)`` for one that did not happen (the
  SDK gives the model that exact text), then ``Runner.run(agent, state)``.
- ``staged(needs_approval=True)`` does not hand the flag to the SDK as a bool: it makes every
  call at least an ``ask`` of the policy, decided by people; a ``deny`` rule still refuses it.
- A run that pauses on a tool that is not staged (a plain ``function_tool(needs_approval=...)``,
  a shell or MCP approval) is refused with ``InvalidInput`` naming the tool: no worker could run
  it, and the SDK's own approval of it lives only in the process that paused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

from agents import (
    Agent,
    AgentsException,
    FunctionTool,
    Runner,
    RunState,
    ToolApprovalItem,
    function_tool,
)
from agents.function_schema import FuncSchema, function_schema
from agents.result import RunResult
from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext
from pydantic import ValidationError

from pending_actions.adapters import core
from pending_actions.adapters.core import AgentRun, Done, Paused, Step, ToolCall
from pending_actions.broker.errors import InvalidInput, PendingActionsError
from pending_actions.producers.aio import AsyncPendingActions

__all__ = ["EXTRA", "AgentRun", "resume", "run", "staged"]

EXTRA = "openai-agents"

# Options of ``function_tool`` that staged() sets itself or names otherwise.
_OURS = {"name_override": "name", "needs_approval": "needs_approval"}


@dataclass(frozen=True)
class _Staged:
    """What the adapter keeps of one staged tool: the shared core's ``Tool`` and ``fn``'s
    schema, which validates the model's arguments into the payload the policy decides and the
    worker applies."""

    tool: core.Tool
    schema: FuncSchema

    def payload(self, arguments: str | dict[str, Any] | None) -> dict[str, Any] | None:
        """The call's arguments validated by ``fn``'s own schema, as JSON (defaults filled in):
        what the policy decides and the worker gets; None when they are not valid (the SDK's
        invocation then reports that to the model, and ``fn`` does not run)."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        try:
            parsed = self.schema.params_pydantic_model(**arguments)
        except (ValidationError, TypeError):
            return None
        dumped: dict[str, Any] = parsed.model_dump(mode="json")
        return dumped


_STAGED: dict[str, _Staged] = {}


@overload
def staged(fn: Callable[..., Any], *, name: str | None = None, needs_approval: bool = False,
           **function_tool_options: Any) -> FunctionTool: ...


@overload
def staged(fn: None = None, *, name: str | None = None, needs_approval: bool = False,
           **function_tool_options: Any) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def staged(fn: Callable[..., Any] | None = None, *, name: str | None = None,
           needs_approval: bool = False, **function_tool_options: Any
           ) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """The SDK's own ``FunctionTool`` for ``fn`` (plain arguments, no ``RunContextWrapper``: it
    also runs in a worker, where there is no run) whose calls become pending actions: ``tool`` =
    the tool's name, ``payload`` = the call's validated arguments as JSON, apply handler ``fn``
    registered as ``openai-agents:<name>``. ``needs_approval``: every call is at least an
    ``ask``, even where the policy would allow it. ``function_tool_options`` go to
    ``function_tool`` (``description_override``, ``docstring_style``, ``failure_error_function``,
    ``strict_mode``, ``is_enabled``, ``timeout``, guardrails, ...)."""
    def make(f: Callable[..., Any]) -> FunctionTool:
        return _staged(f, name, needs_approval, function_tool_options)
    return make if fn is None else make(fn)


def _staged(fn: Callable[..., Any], name: str | None, needs_approval: bool,
            options: dict[str, Any]) -> FunctionTool:
    taken = [f"{key} (use {ours}=)" for key, ours in _OURS.items() if key in options]
    if taken:
        raise TypeError(f"staged() takes no {', '.join(taken)}")
    if not isinstance(needs_approval, bool):
        # a per-call callable would decide apart from the policy: a policy rule says the same
        raise TypeError("staged(needs_approval=...) takes a bool; decide per call with a "
                        "policy rule (docs/policies.md)")
    built = function_tool(fn, name_override=name, **options)
    # the same schema function_tool built its own from: it validates the model's arguments
    # into the payload, and the payload back into fn's arguments in the worker
    schema = function_schema(fn, name_override=name)
    if schema.takes_context:
        raise TypeError(f"{built.name}: a staged tool cannot take a RunContextWrapper: its body "
                        "runs in a worker, where there is no run")
    tool = core.Tool(EXTRA, built.name, fn, asks=needs_approval,
                     arguments=lambda payload: schema.to_call_args(
                         schema.params_pydantic_model(**payload)))
    staged_tool = _Staged(tool, schema)
    invoke_fn = built.on_invoke_tool  # the SDK's invocation of fn: for a call the policy allows

    async def needs(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        payload = staged_tool.payload(params)
        if payload is None:
            return False  # not valid: the invocation says so to the model, fn does not run
        verdict = await core.current().decide(tool, call_id, payload, raw=params)
        return verdict.decision == "ask"

    async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        running = core.current()
        call_id = ctx.tool_call_id
        outcome = running.resolved(call_id)
        if outcome is not None:  # resumed: what people decided (fn ran in a worker, or not)
            return outcome
        payload = staged_tool.payload(arguments)
        if payload is None:
            return await invoke_fn(ctx, arguments)  # the SDK's own error for bad arguments
        verdict = await running.decide(tool, call_id, payload, raw=_raw(arguments))
        if verdict.decision == "allow":
            return await invoke_fn(ctx, arguments)
        if verdict.decision == "ask":
            # needs() said ask, so the SDK should have paused: an approval given by other
            # means (the SDK's own always_approve) does not run a call people must decide
            raise RuntimeError(f"{built.name}: call {call_id} must be decided by people, but "
                               "the run went on without pending_actions")
        return verdict.text  # deny: the refusal

    # One FunctionTool, the one function_tool built, changed in place: the SDK's invocation
    # stays bound to it (its failure handling names this tool).
    built.needs_approval = needs
    built.on_invoke_tool = invoke
    _STAGED[built.name] = staged_tool
    return built


def _raw(arguments: object) -> object:
    """The arguments as the model wrote them (what ``core.digest`` tells calls apart by), as
    the SDK parses them for ``needs_approval``."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments


def _ours(item: ToolApprovalItem) -> _Staged:
    """The staged tool an interruption is for; any other tool's is refused: nothing here could
    pause it for people (no worker runs it), and the SDK's own approval of it would be lost with
    this process."""
    found = _STAGED.get(item.tool_name or "")
    if found is None or getattr(item.raw_item, "type", None) != "function_call":
        raise InvalidInput("tool", f"the run paused on {item.tool_name!r}, which is not a staged "
                           "tool (a function_tool with needs_approval, or another kind of tool "
                           "the SDK asks approval for): no worker could run it. Make it "
                           "staged(needs_approval=True) to have people decide it")
    return found


async def _step(agent: Agent[Any], result: RunResult, options: dict[str, Any]) -> Step:
    """What a ``Runner.run`` came to: done, or paused on the staged calls people decide. An
    interruption the policy was not asked about (the SDK asks approval by itself for arguments
    that are not a JSON object) is decided here and the run continued at once."""
    while True:
        if not result.interruptions:
            return Done(result.final_output)
        running = core.current()
        state: RunState[Any] | None = None
        calls: list[ToolCall] = []
        for item in result.interruptions:
            found, call_id = _ours(item), item.call_id or ""
            payload = found.payload(item.arguments)
            if payload is None:
                verdict = core.Verdict("deny", f"Invalid arguments for {found.tool.name}: not "
                                       "a JSON object of its parameters. Nothing was run.")
            else:  # asked already by needs_approval (cached), or first asked here
                verdict = await running.decide(found.tool, call_id, payload,
                                               raw=_raw(item.arguments))
                if verdict.decision == "ask":
                    calls.append(ToolCall(call_id, found.tool.name, payload))
                    continue
            state = state or result.to_state()
            if verdict.decision == "allow":
                state.approve(item)
            else:
                state.reject(item, rejection_message=verdict.text)
        if state is None:
            return Paused(result.to_state().to_string(), calls)
        result = await _run(agent, state, options)


async def _run(agent: Agent[Any], input: Any, options: dict[str, Any]) -> RunResult:
    """``Runner.run``, raising our own errors as themselves: the SDK wraps what a tool's
    ``needs_approval`` or invocation raises in its ``UserError`` ("Error running tool ..."), and a
    caller of ``run`` catches ``RedisUnavailable`` or ``InvalidInput``, not the SDK's wrapper."""
    try:
        return await Runner.run(agent, input, **options)
    except AgentsException as exc:
        if isinstance(exc.__cause__, PendingActionsError):
            raise exc.__cause__ from None
        raise


class OpenAIAgents:
    """The ``core.Framework`` of the OpenAI Agents SDK."""

    extra = EXTRA

    async def start(self, agent: Any, input: Any, session: str,
                    options: dict[str, Any]) -> Step:
        return await _step(agent, await _run(agent, input, options), options)

    async def cont(self, agent: Any, state: str, session: str,
                   options: dict[str, Any]) -> Step:
        # A context given again (context=) is the run's from here on: the state keeps what the
        # SDK could serialize of the one run() had (a mapping, a dataclass as a mapping).
        given = options.get("context")
        restored = await RunState.from_string(agent, state, context_override=given)
        running = core.current()
        for item in restored.get_interruptions():
            _ours(item)  # a tool that is not staged is refused here too
            call_id = item.call_id or ""
            text = running.resolved(call_id)
            if text is None:
                raise RuntimeError(f"call {call_id} of session {session} is not decided yet")
            if running.was_applied(call_id):
                # the SDK invokes the tool: its on_invoke_tool gives the handler's result
                restored.approve(item)
            else:  # it did not happen: the SDK gives the model exactly this text
                restored.reject(item, rejection_message=text)
        return await _step(agent, await _run(agent, restored, options), options)


FRAMEWORK = OpenAIAgents()


async def run(agent: Agent[Any], input: Any, *, session: str, tenant: str = "default",
              pa: AsyncPendingActions | None = None, wait: float = 0,
              **options: Any) -> AgentRun:
    """Run an OpenAI Agents SDK ``Agent`` on ``input`` in this process (``Runner.run``). A
    staged tool's call is decided by the tenant's policy: ``deny`` answers the model with the
    reason, ``allow`` runs the tool here, ``ask`` stages it and the run pauses (``status ==
    "paused"``, ``pending`` the ids), its ``RunState`` kept in Redis with the session.
    ``options`` go to ``Runner.run`` (``context=``, ``run_config=``, ``max_turns=``,
    ``hooks=``, ...; not its ``session=``, which is this function's)."""
    return await core.run(FRAMEWORK, agent, input, session=session, tenant=tenant, pa=pa,
                          wait=wait, options=options)


async def resume(agent: Agent[Any], *, session: str, tenant: str = "default",
                 pa: AsyncPendingActions | None = None, wait: float = 0,
                 **options: Any) -> AgentRun:
    """Continue the session's paused run, in any process that has the agent, once people
    decided its calls: each call's result (the handler's, or the discard's text) goes to the
    model as the tool's result. While one is still pending the run stays paused. ``options``
    go to ``Runner.run`` (pass ``context=`` again: a context that is not a mapping is not in the
    SDK's serialized state)."""
    return await core.resume(FRAMEWORK, agent, session=session, tenant=tenant, pa=pa,
                             wait=wait, options=options)
