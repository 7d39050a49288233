"""The agents of the adapters' benchmark (``bench/adapters.py``), one per framework, each twice:
with the framework's own approval (its pausing tool: ``needs_approval``, ``requires_approval``,
``interrupt()``) and with a staged tool. The same offline model drives both: its first turn
calls ``note`` with the prompt as ``text``, its second answers with what the tool returned. The
worker of the benchmark imports this module (``--handlers``) for the staged tools' handlers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import Agent as OpenAIAgent
from agents import ModelResponse, ModelSettings, Tool, Usage, function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.testing import assistant_message, function_call
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool as langchain_tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.messages import ModelResponse as PydanticResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pending_actions.adapters import langgraph as lg
from pending_actions.adapters import openai_agents as oa
from pending_actions.adapters import pydantic_ai as pai

set_tracing_disabled(True)  # the SDK's own tracing exports to the network


def note(text: str) -> str:
    """Keep a note."""
    return f"noted {text}"


# --- OpenAI Agents SDK -----------------------------------------------------------------------
class NoteModel(Model):
    """Calls ``note`` with the user's text, then says what it returned."""

    async def get_response(
        self, system_instructions: str | None, input: str | list[TResponseInputItem],
        model_settings: ModelSettings, tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff],
        tracing: ModelTracing, *, previous_response_id: str | None,
        conversation_id: str | None, prompt: ResponsePromptParam | None) -> ModelResponse:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) \
            else list(input)
        seen = [str(_field(i, "output")) for i in items
                if _field(i, "type") == "function_call_output"]
        output: list[TResponseOutputItem]
        if seen:
            output = [assistant_message("model saw: " + seen[-1])]
        else:
            text = next(str(_field(i, "content")) for i in items if _field(i, "role") == "user")
            output = [function_call("note", {"text": text}, call_id="call-note")]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    async def stream_response(
        self, system_instructions: str | None, input: str | list[TResponseInputItem],
        model_settings: ModelSettings, tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff],
        tracing: ModelTracing, *, previous_response_id: str | None,
        conversation_id: str | None, prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the benchmark does not stream")
        yield  # an async generator, as the interface has it


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


openai_own = OpenAIAgent(name="own", model=NoteModel(),
                         tools=[function_tool(note, needs_approval=True)])
openai_ours = OpenAIAgent(name="ours", model=NoteModel(), tools=[oa.staged(note)])


# --- Pydantic AI ------------------------------------------------------------------------------
def _pydantic_model(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
    seen = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]
    if seen:
        return PydanticResponse(parts=[TextPart(f"model saw: {seen[-1].content}")])
    text = next(p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
                if isinstance(p, UserPromptPart))
    return PydanticResponse(parts=[ToolCallPart("note", {"text": str(text)})])


pydantic_own: PydanticAgent[None, str | DeferredToolRequests] = PydanticAgent(
    FunctionModel(_pydantic_model), output_type=[str, DeferredToolRequests])
pydantic_own.tool_plain(requires_approval=True)(note)
pydantic_ours = PydanticAgent(FunctionModel(_pydantic_model), tools=[pai.staged(note)])


# --- LangGraph --------------------------------------------------------------------------------
@langchain_tool("note")
def _asking_note(text: str) -> str:
    """Keep a note."""
    answer = interrupt({"tool": "note", "text": text})
    return note(text) if answer == "apply" else str(answer)


def _graph_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    messages = state["messages"]
    if isinstance(messages[-1], ToolMessage):
        return {"messages": [AIMessage(f"model saw: {messages[-1].content}")]}
    text = next(m.content for m in messages if isinstance(m, HumanMessage))
    return {"messages": [AIMessage("", tool_calls=[
        {"name": "note", "args": {"text": str(text)}, "id": "call-note", "type": "tool_call"}])]}


langgraph_note = lg.staged(note)


def graph(checkpointer: BaseCheckpointSaver[Any],
          ours: bool) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model -> tools -> model on ``checkpointer``: the tool asks with ``interrupt()`` (the
    graph's own way), or is staged (``ours``)."""
    builder = StateGraph(MessagesState)
    builder.add_node("model", _graph_model)
    builder.add_node("tools", ToolNode([langgraph_note if ours else _asking_note]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)
