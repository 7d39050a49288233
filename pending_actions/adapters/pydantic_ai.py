"""Pydantic AI inside pending actions (extra ``pydantic-ai``): ``staged`` makes a Pydantic AI
``Tool`` whose calls the tenant's policy decides, ``run`` and ``resume`` drive a plain ``Agent``
so that a call people must decide ends the run with Pydantic AI's own ``DeferredToolRequests``
and continues, in any process, with its own ``DeferredToolResults``.

How the framework's pieces are used:

- A staged tool's function takes the ``RunContext`` (for ``ctx.tool_call_id``) while its schema
  stays ``fn``'s own. It asks ``core.current().decide(...)``: ``allow`` runs ``fn`` here,
  ``deny`` and an earlier decision answer their text as the tool's result, ``ask`` raises
  ``CallDeferred`` (a call executed elsewhere: by our worker), so the run ends with
  ``DeferredToolRequests.calls``.
- The state kept in Redis is the run's message history (``ModelMessagesTypeAdapter`` JSON); the
  continuation is ``agent.run(message_history=..., deferred_tool_results=
  DeferredToolResults(calls={call id: text}))``, which never calls the tool function again: the
  text is the tool's result as the model sees it.
- ``staged(requires_approval=True)`` does not set Pydantic AI's own ``requires_approval`` (that
  defers the call before the tool function runs, so no policy could deny it and nothing would
  stage it); it makes the call at least an ``ask`` of the policy instead, decided by people.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, overload

from pydantic_ai import CallDeferred, DeferredToolRequests, DeferredToolResults, RunContext, Tool
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
)
from pydantic_core import to_jsonable_python

from pending_actions.adapters import core
from pending_actions.adapters.core import AgentRun, Done, Paused, Step, ToolCall
from pending_actions.producers.aio import AsyncPendingActions

__all__ = ["EXTRA", "AgentRun", "resume", "run", "staged"]

EXTRA = "pydantic-ai"

# Options of ``Tool`` that the adapter sets itself: a staged tool's function is ours (it takes
# the context), and its schema is ``fn``'s.
_OURS = ("takes_ctx", "function_schema")


@overload
def staged(fn: Callable[..., Any], *, name: str | None = None, requires_approval: bool = False,
           **tool_options: Any) -> Tool[Any]: ...


@overload
def staged(fn: None = None, *, name: str | None = None, requires_approval: bool = False,
           **tool_options: Any) -> Callable[[Callable[..., Any]], Tool[Any]]: ...


def staged(fn: Callable[..., Any] | None = None, *, name: str | None = None,
           requires_approval: bool = False,
           **tool_options: Any) -> Tool[Any] | Callable[[Callable[..., Any]], Tool[Any]]:
    """A Pydantic AI ``Tool`` for ``fn`` (plain arguments, no ``RunContext``: it also runs in a
    worker, where there is no run) whose calls become pending actions: ``tool`` = the tool's
    name, ``payload`` = the call's validated arguments as JSON, apply handler ``fn`` registered
    as ``pydantic-ai:<name>``. ``requires_approval``: every call is at least an ``ask``, even
    where the policy would allow it. ``tool_options`` go to ``Tool`` (``description``,
    ``docstring_format``, ``max_retries``, ``strict``, ``timeout``, ...)."""
    def make(f: Callable[..., Any]) -> Tool[Any]:
        return _staged(f, name, requires_approval, tool_options)
    return make if fn is None else make(fn)


def _staged(fn: Callable[..., Any], name: str | None, requires_approval: bool,
            tool_options: dict[str, Any]) -> Tool[Any]:
    taken = [key for key in _OURS if key in tool_options]
    if taken:
        raise TypeError(f"staged() sets {', '.join(taken)} itself")
    # Pydantic AI builds the schema it shows the model (and validates calls with) from fn's own
    # signature and docstring; the tool then calls our function in its place.
    plain: Tool[Any] = Tool(fn, takes_ctx=False, name=name, **tool_options)
    schema = plain.function_schema
    if schema.var_positional_field is not None:
        raise TypeError(f"a staged tool cannot take *{schema.var_positional_field}: its "
                        "arguments are kept as a JSON object")
    tool = core.Tool(EXTRA, plain.name, fn, asks=requires_approval,
                     arguments=functools.partial(_arguments, schema))

    async def call(ctx: RunContext[Any], *args: Any, **kwargs: Any) -> Any:
        # positional-only parameters come positionally (as Pydantic AI calls them)
        arguments = {**dict(zip(schema.positional_fields, args, strict=True)), **kwargs}
        payload: dict[str, Any] = to_jsonable_python(arguments)
        call_id = ctx.tool_call_id
        if call_id is None:  # Pydantic AI always sets it for a tool call
            raise RuntimeError(f"{plain.name}: called without a tool call id")
        verdict = await core.current().decide(tool, call_id, payload)
        if verdict.decision == "allow":
            return await tool.call_local(payload)
        if verdict.decision == "ask":
            # the arguments as decided (validated, defaults filled in) ride along, so what is
            # staged is what the policy saw
            raise CallDeferred(metadata={"arguments": payload})
        return verdict.text  # deny: the refusal; resolved: what people decided before

    ours = dataclasses.replace(schema, function=call, takes_ctx=True, is_async=True)
    return Tool(call, takes_ctx=True, name=plain.name, function_schema=ours, **tool_options)


def _arguments(schema: Any, payload: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """A payload as Pydantic AI passes a tool's arguments: validated again by the tool's own
    schema, positional-only parameters by position."""
    kwargs = dict(schema.revalidate(payload))
    return [kwargs.pop(field) for field in schema.positional_fields], kwargs


def _output_type(agent: AbstractAgent[Any, Any], given: Any) -> Any:
    """The run's output type: the agent's (or the caller's ``output_type``) with
    ``DeferredToolRequests`` added, so that a deferred call ends the run instead of failing
    it. None (the agent's own) when it already has it: an agent with output validators
    refuses any run ``output_type``, and such an agent has to declare it itself."""
    base = agent.output_type if given is None else given
    spec = list(base) if isinstance(base, Sequence) and not isinstance(base, str) else [base]
    if DeferredToolRequests in spec:
        return given
    return [*spec, DeferredToolRequests]


def _serialize(messages: list[ModelMessage]) -> str:
    return ModelMessagesTypeAdapter.dump_json(messages).decode()


def _step(result: Any) -> Step:
    output = result.output
    if not isinstance(output, DeferredToolRequests):
        return Done(output)
    running = core.current()
    if output.approvals:
        names = sorted({call.tool_name for call in output.approvals})
        raise RuntimeError(f"tools {', '.join(names)} asked for Pydantic AI's own approval: "
                           "only staged tools pause a run here (staged(requires_approval=True) "
                           "for a tool people decide)")
    calls = []
    for call in output.calls:
        verdict = running.verdict(call.tool_call_id)
        if verdict is None or verdict.decision != "ask":
            raise RuntimeError(f"tool {call.tool_name} deferred its call: only staged tools "
                               "pause a run here")
        arguments = output.metadata.get(call.tool_call_id, {}).get("arguments")
        calls.append(ToolCall(call.tool_call_id, call.tool_name,
                              arguments if arguments is not None else call.args_as_dict()))
    return Paused(_serialize(result.all_messages()), calls)


def _open_calls(messages: Sequence[ModelMessage]) -> list[str]:
    """The ids of the calls the history's last response made that have no result yet (what
    Pydantic AI itself expects ``deferred_tool_results`` for); the calls that ran before the
    pause have theirs in the request after it."""
    for index in range(len(messages) - 1, -1, -1):
        response = messages[index]
        if isinstance(response, ModelResponse):
            # a retry prompt bound to a call answers it too (older histories hold them)
            answered = {getattr(part, "tool_call_id", None)
                        for later in messages[index + 1:] if isinstance(later, ModelRequest)
                        for part in later.parts
                        if isinstance(part, ToolReturnPart) or part.part_kind == "retry-prompt"}
            return [call.tool_call_id for call in response.tool_calls
                    if call.tool_call_id not in answered]
    return []


class PydanticAI:
    """The ``core.Framework`` of Pydantic AI."""

    extra = EXTRA

    async def start(self, agent: Any, input: Any, session: str,
                    options: dict[str, Any]) -> Step:
        options = dict(options)
        output_type = _output_type(agent, options.pop("output_type", None))
        return _step(await agent.run(input, output_type=output_type, **options))

    async def cont(self, agent: Any, state: str, session: str,
                   options: dict[str, Any]) -> Step:
        options = dict(options)
        output_type = _output_type(agent, options.pop("output_type", None))
        history = ModelMessagesTypeAdapter.validate_json(state)
        running = core.current()
        results: dict[str, Any] = {}
        for call_id in _open_calls(history):
            text = running.resolved(call_id)
            if text is None:
                raise RuntimeError(f"call {call_id} of session {session} is not decided yet")
            # applied: the handler's result; discarded: "Discarded: <label>. Reason: <reason>".
            # Both are plain tool results (outcome "success"): a discard is people's answer, not
            # an error to retry (ModelRetry would ask the model to call again and spend its
            # retries; ToolFailed goes down the provider's error channel).
            results[call_id] = text
        return _step(await agent.run(message_history=history, output_type=output_type,
                                     deferred_tool_results=DeferredToolResults(calls=results),
                                     **options))


FRAMEWORK = PydanticAI()


async def run(agent: AbstractAgent[Any, Any], input: Any, *, session: str,
              tenant: str = "default", pa: AsyncPendingActions | None = None, wait: float = 0,
              **options: Any) -> AgentRun:
    """Run a plain Pydantic AI ``Agent`` on ``input`` (its user prompt) in this process. A
    staged tool's call is decided by the tenant's policy: ``deny`` answers the model with the
    reason, ``allow`` runs the tool here, ``ask`` stages it and the run pauses (``status ==
    "paused"``, ``pending`` the ids), its message history kept in Redis with the session.
    ``options`` go to ``agent.run`` (``deps=``, ``model_settings=``, ``usage_limits=``, an
    ``output_type=`` to which ``DeferredToolRequests`` is added, ...)."""
    return await core.run(FRAMEWORK, agent, input, session=session, tenant=tenant, pa=pa,
                          wait=wait, options=options)


async def resume(agent: AbstractAgent[Any, Any], *, session: str, tenant: str = "default",
                 pa: AsyncPendingActions | None = None, wait: float = 0,
                 **options: Any) -> AgentRun:
    """Continue the session's paused run, in any process that has the agent, once people
    decided its calls: each call's result (the handler's, or the discard's text) goes to the
    model as the tool's result. While one is still pending the run stays paused."""
    return await core.resume(FRAMEWORK, agent, session=session, tenant=tenant, pa=pa,
                             wait=wait, options=options)
