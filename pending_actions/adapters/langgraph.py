"""LangGraph inside pending actions (extra ``langgraph``): ``staged`` makes a LangChain
``BaseTool`` whose calls the tenant's policy decides; ``run`` and ``resume`` drive a compiled
graph (a ``ToolNode`` graph, or LangChain v1's agents built on one) so that a call people must
decide pauses the graph with LangGraph's own ``interrupt()`` and continues, in any process, with
its own ``Command(resume=...)``, on the thread ``session`` of the graph's checkpointer.

How the framework's pieces are used:

- A staged tool is a ``StructuredTool`` whose schema, as the model sees it, is ``fn``'s own; it
  also takes the call's id (``InjectedToolCallId``, filled in by LangChain from the ``ToolCall``
  that ``ToolNode`` passes). It asks ``core.current().decide(...)``: ``allow`` runs ``fn`` here,
  ``deny`` and an earlier decision answer their text as the tool's result, ``ask`` calls
  ``interrupt({...the call...})``, so the graph pauses and its checkpointer keeps its state.
- The graph's state is the checkpointer's: nothing of it is copied into Redis. What Redis keeps
  (``Paused.state``) is this adapter's own note of the calls it already answered in the paused
  step: LangGraph re-runs an interrupted node from its start on resume, and a ``ToolNode`` runs
  all the calls of one model turn in that one node, so a call the policy allowed (run here
  already) or denied (recorded already) must give the same answer again without running again.
- A ``ToolNode`` runs a turn's calls with ``asyncio.gather``: the first ``interrupt()`` ends
  the node (and LangGraph reports only that one) while the other calls still run. ``run``
  waits for them, and every call of the turn that asked is staged in the one pause, whether
  its own interrupt reached LangGraph or not. (Dispatched with the Send API, as LangChain v1's
  ``create_agent`` does, each call is a task and each ask an interrupt of its own.)
- Resume is ``graph.ainvoke(Command(resume={interrupt id: text, ...}), config)``: a map naming
  every pending interrupt, which LangGraph requires when more than one is pending. The staged
  tool, re-run, finds its call decided (``current().resolved``) before it would call
  ``interrupt()`` again, so nothing is staged twice and no policy is asked twice.
- ``staged(interrupt_on=True)`` (or an ``InterruptOnConfig``-like dict) is what an entry of
  LangChain v1's ``HumanInTheLoopMiddleware(interrupt_on={name: ...})`` says of one tool: its
  calls are at least an ``ask`` of the policy, decided by people in the inbox.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, overload

import orjson
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langchain_core.tools.base import _get_runnable_config_param
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, GraphOutput, Interrupt, interrupt
from pydantic import BaseModel, create_model
from pydantic_core import to_jsonable_python

from pending_actions.adapters import core
from pending_actions.adapters.core import AgentRun, Done, Paused, Step, ToolCall
from pending_actions.producers.aio import AsyncPendingActions

__all__ = ["EXTRA", "INTERRUPT_TYPE", "AgentRun", "resume", "run", "staged"]

EXTRA = "langgraph"

# The value of a staged tool's interrupt says what it is, so that a pause of anything else (an
# interrupt() of the graph's own, a HumanInTheLoopMiddleware) is told apart and refused.
INTERRUPT_TYPE = "pending_action"

# Options of StructuredTool the adapter sets itself.
_OURS = ("func", "coroutine")
# Options that only shape the schema and description taken from fn.
_SCHEMA_OPTIONS = ("description", "args_schema", "infer_schema", "parse_docstring",
                   "error_on_invalid_docstring")
# What an ``InterruptOnConfig`` of HumanInTheLoopMiddleware may hold that still maps: people
# decide (approve: a person's apply; reject: a discard; edit: an approver's edit). ``when``
# does not map: a policy rule (``match.payload``) says which calls are asked.
_INTERRUPT_ON_KEYS = frozenset({"allowed_decisions", "description", "args_schema"})


@overload
def staged(fn: Callable[..., Any], *, name: str | None = None,
           interrupt_on: bool | Mapping[str, Any] = False, **tool_options: Any) -> BaseTool: ...


@overload
def staged(fn: None = None, *, name: str | None = None,
           interrupt_on: bool | Mapping[str, Any] = False,
           **tool_options: Any) -> Callable[[Callable[..., Any]], BaseTool]: ...


def staged(fn: Callable[..., Any] | None = None, *, name: str | None = None,
           interrupt_on: bool | Mapping[str, Any] = False,
           **tool_options: Any) -> BaseTool | Callable[[Callable[..., Any]], BaseTool]:
    """A LangChain ``StructuredTool`` for ``fn`` (plain arguments: it also runs in a worker,
    where there is no graph, so no injected state, store, runtime or config) whose calls become
    pending actions: ``tool`` = the tool's name, ``payload`` = the call's validated arguments
    as JSON, apply handler ``fn`` registered as ``langgraph:<name>``. ``interrupt_on``: what an
    entry of ``HumanInTheLoopMiddleware(interrupt_on=...)`` says of this tool (``True`` or an
    ``InterruptOnConfig`` dict): every call is at least an ``ask``, even where the policy would
    allow it. ``tool_options`` go to ``StructuredTool.from_function`` (``description``,
    ``parse_docstring``, ``return_direct``, ``args_schema``, ``tags``, ...)."""
    asks = _asks(interrupt_on)

    def make(f: Callable[..., Any]) -> BaseTool:
        return _staged(f, name, asks, tool_options)
    return make if fn is None else make(fn)


def _asks(interrupt_on: bool | Mapping[str, Any]) -> bool:
    if isinstance(interrupt_on, bool):
        return interrupt_on
    if not isinstance(interrupt_on, Mapping):
        raise TypeError("interrupt_on: True, False or an InterruptOnConfig dict")
    unknown = sorted(set(interrupt_on) - _INTERRUPT_ON_KEYS)
    if unknown:
        raise TypeError(f"interrupt_on: {', '.join(unknown)} does not map to pending actions "
                        "(a 'when' predicate is a policy rule's match.payload here)")
    return True


def _staged(fn: Callable[..., Any], name: str | None, asks: bool,
            tool_options: dict[str, Any]) -> BaseTool:
    taken = [key for key in _OURS if key in tool_options]
    if taken:
        raise TypeError(f"staged() sets {', '.join(taken)} itself")
    if tool_options.get("response_format", "content") != "content":
        raise TypeError("a staged tool's result is the text the model reads: "
                        "response_format='content' only")
    if _get_runnable_config_param(fn) is not None:
        raise TypeError(f"{fn.__name__} takes the RunnableConfig: a staged tool's body runs "
                        "in a worker, where there is no graph run")
    # LangChain builds the schema the model sees (and validates calls with) from fn's own
    # signature and docstring, as @tool would
    shaping = {k: v for k, v in tool_options.items() if k in _SCHEMA_OPTIONS}
    if inspect.iscoroutinefunction(fn):
        plain = StructuredTool.from_function(coroutine=fn, name=name, **shaping)
    else:
        plain = StructuredTool.from_function(func=fn, name=name, **shaping)
    schema = plain.args_schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise TypeError("a staged tool's args_schema is a pydantic (v2) model: its calls are "
                        "validated again in the worker")
    injected = sorted(plain._injected_args_keys)  # InjectedState, ToolRuntime, ...
    fields = set(schema.model_fields)
    if injected or "tool_call_id" in fields:
        raise TypeError(f"{plain.name}: a staged tool's body runs in a worker, where nothing "
                        f"is injected: {', '.join(injected or ['tool_call_id'])}")
    tool = core.Tool(EXTRA, plain.name, fn, asks=asks,
                     arguments=functools.partial(_arguments, schema))

    async def call(tool_call_id: Annotated[str, InjectedToolCallId], **kwargs: Any) -> Any:
        return await _call(tool, tool_call_id, kwargs)

    # fn's schema plus the call's id, which LangChain fills in from the ToolCall and leaves out
    # of what the model sees (tool_call_schema)
    ours: type[BaseModel] = create_model(
        schema.__name__, __base__=schema,
        tool_call_id=(Annotated[str, InjectedToolCallId], ...))
    rest = {k: v for k, v in tool_options.items() if k not in _SCHEMA_OPTIONS}
    return StructuredTool.from_function(coroutine=call, name=plain.name,
                                        description=plain.description, args_schema=ours,
                                        infer_schema=False, **rest)


def _arguments(schema: type[BaseModel],
               payload: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """A payload as LangChain passes a tool's arguments: validated again by the tool's own
    schema, by keyword."""
    model = schema.model_validate(payload)
    return [], {k: getattr(model, k) for k in payload if k in schema.model_fields}


@dataclass
class _Pass:
    """What the staged tools did during one ``graph.ainvoke`` of a run or resume."""

    replay: dict[str, Any]  # call id -> what the paused step answered before (allow, deny)
    answered: dict[str, Any] = field(default_factory=dict)  # call id -> answered in this pass
    asks: dict[str, ToolCall] = field(default_factory=dict)  # call id -> paused on
    order: list[str] = field(default_factory=list)  # call ids as the tools were called
    busy: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def enter(self, call_id: str) -> None:
        self.order.append(call_id)
        self.busy += 1
        self.idle.clear()

    def leave(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.idle.set()


_pass: contextvars.ContextVar[_Pass] = contextvars.ContextVar("pending_actions_langgraph_pass")


async def _call(tool: core.Tool, call_id: str, arguments: dict[str, Any]) -> Any:
    running = core.current()  # outside run()/resume(): refused, nothing runs
    record = _pass.get(None)
    if record is None:
        raise RuntimeError(f"{tool.name} is a LangGraph staged tool: it runs in a graph that "
                           "pending_actions.adapters.langgraph's run() or resume() drives")
    if call_id in record.replay:  # the paused step re-run: the same answer, nothing again
        return record.replay[call_id]
    payload: dict[str, Any] = to_jsonable_python(arguments, fallback=str)
    record.enter(call_id)
    try:
        verdict = await running.decide(tool, call_id, payload)
        if verdict.decision == "allow":
            value = await tool.call_local(payload)
            record.answered[call_id] = to_jsonable_python(value, fallback=str)
            return value
        if verdict.decision == "deny":
            record.answered[call_id] = verdict.text
            return verdict.text
        if verdict.decision == "resolved":
            return verdict.text
        record.asks[call_id] = ToolCall(call_id, tool.name, payload)
    finally:
        # counted before interrupt() raises: a ToolNode runs a turn's calls with
        # asyncio.gather, whose first interrupt ends the node while the others still run
        record.leave()
    interrupt({"type": INTERRUPT_TYPE, "call_id": call_id, "tool": tool.name,
               "arguments": payload})
    # interrupt() returned: LangGraph had a resume value for it. What the model gets is what
    # the store says people decided, never the value itself.
    text = running.resolved(call_id)
    if text is None:
        raise RuntimeError(f"{tool.name}: call {call_id} was resumed before it was decided")
    return text


@contextmanager
def _passing(record: _Pass) -> Iterator[_Pass]:
    token = _pass.set(record)
    try:
        yield record
    finally:
        _pass.reset(token)


def _config(agent: Any, session: str, options: dict[str, Any]) -> tuple[dict[str, Any],
                                                                           dict[str, Any]]:
    """The run's ``config`` (the caller's, on the thread ``session``) and the other options
    of ``ainvoke``."""
    checkpointer = getattr(agent, "checkpointer", None)
    if checkpointer is None or isinstance(checkpointer, bool):
        raise TypeError("the graph has no checkpointer: compile it with one that every process "
                        "reads (AsyncPostgresSaver, AsyncSqliteSaver on a shared file, ...)")
    if isinstance(checkpointer, InMemorySaver):
        raise TypeError("the graph's checkpointer is an InMemorySaver: it keeps the paused "
                        "graph in this process only, so no other process could resume it; "
                        "compile it with AsyncPostgresSaver, AsyncSqliteSaver on a shared "
                        "file, or another checkpointer every process reads")
    rest = dict(options)
    given: dict[str, Any] = dict(rest.pop("config", None) or {})
    configurable = dict(given.get("configurable") or {})
    thread = configurable.get("thread_id", session)
    if str(thread) != session:
        raise ValueError(f"config's thread_id {thread!r} is not the session {session!r}: "
                         "the session is the thread")
    if "checkpoint_id" in configurable:
        raise ValueError("config's checkpoint_id: a run goes on from its thread's latest "
                         "checkpoint only")
    configurable["thread_id"] = session
    given["configurable"] = configurable
    return given, rest


def _call_of(pending: Interrupt) -> ToolCall:
    value = pending.value
    if not (isinstance(value, dict) and value.get("type") == INTERRUPT_TYPE):
        raise RuntimeError(
            f"the graph paused on an interrupt that is no staged tool's ({value!r:.200}): "
            "only staged tools pause a run here (HumanInTheLoopMiddleware's interrupt_on "
            "becomes staged(fn, interrupt_on=...))")
    return ToolCall(str(value["call_id"]), str(value["tool"]), dict(value["arguments"]))


async def _step(agent: Any, config: dict[str, Any], result: Any, record: _Pass) -> Step:
    # a call still running when the node's first interrupt ended it is waited for: what it
    # did (an allowed call run here, another ask) belongs to this pause
    await record.idle.wait()
    output = result.value if isinstance(result, GraphOutput) else result
    snapshot = await agent.aget_state(config)
    if not snapshot.interrupts:
        if snapshot.next:
            raise RuntimeError(f"the graph stopped before {', '.join(snapshot.next)} without "
                               "an interrupt (interrupt_before/interrupt_after): only staged "
                               "tools pause a run here")
        return Done(output)
    calls = {c.call_id: c for c in map(_call_of, snapshot.interrupts)}
    for call_id in record.order:  # the node's other asks, whose interrupt() came too late
        if call_id in record.asks:
            calls.setdefault(call_id, record.asks[call_id])
    return Paused(orjson.dumps({"answered": record.answered}).decode(), list(calls.values()))


class LangGraph:
    """The ``core.Framework`` of LangGraph."""

    extra = EXTRA

    async def start(self, agent: Any, input: Any, session: str,
                    options: dict[str, Any]) -> Step:
        config, rest = _config(agent, session, options)
        with _passing(_Pass({})) as record:
            result = await agent.ainvoke(input, config=config, **rest)
            return await _step(agent, config, result, record)

    async def cont(self, agent: Any, state: str, session: str,
                   options: dict[str, Any]) -> Step:
        config, rest = _config(agent, session, options)
        snapshot = await agent.aget_state(config)
        if not snapshot.interrupts:
            raise RuntimeError(
                f"the graph's checkpointer has no paused step on thread {session!r}: it was "
                "paused with another checkpointer (or one only its own process reads)")
        running = core.current()
        answers: dict[str, Any] = {}
        for pending in snapshot.interrupts:
            call = _call_of(pending)
            text = running.resolved(call.call_id)
            if text is None:
                raise RuntimeError(f"call {call.call_id} of session {session} is not decided")
            # every pending interrupt by its id: LangGraph refuses a single value when more
            # than one is pending
            answers[pending.id] = text
        replay: dict[str, Any] = orjson.loads(state)["answered"]
        with _passing(_Pass(replay)) as record:
            result = await agent.ainvoke(Command(resume=answers), config=config, **rest)
            return await _step(agent, config, result, record)


FRAMEWORK = LangGraph()


async def run(graph: Any, input: Any, *, session: str, tenant: str = "default",
              pa: AsyncPendingActions | None = None, wait: float = 0,
              **options: Any) -> AgentRun:
    """Run a compiled graph on ``input`` (its own input, e.g. ``{"messages": [...]}``) in this
    process, on the thread ``session`` of its checkpointer. A staged tool's call is decided by
    the tenant's policy: ``deny`` answers the model with the reason, ``allow`` runs the tool
    here, ``ask`` stages it and the graph pauses (``status == "paused"``, ``pending`` the ids).
    ``options`` go to ``graph.ainvoke`` (``config=`` merged with the thread, ``context=``,
    ``durability=``, ...). Done: ``output`` is the graph's final state."""
    return await core.run(FRAMEWORK, graph, input, session=session, tenant=tenant, pa=pa,
                          wait=wait, options=options)


async def resume(graph: Any, *, session: str, tenant: str = "default",
                 pa: AsyncPendingActions | None = None, wait: float = 0,
                 **options: Any) -> AgentRun:
    """Continue the session's paused graph, in any process that has the graph and reads its
    checkpointer, once people decided its calls: each call's result (the handler's, or the
    discard's text) is the tool's result the model reads. While one is still pending the run
    stays paused."""
    return await core.resume(FRAMEWORK, graph, session=session, tenant=tenant, pa=pa,
                             wait=wait, options=options)
