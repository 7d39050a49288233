"""Pending actions inside agent frameworks: ``openai_agents`` (the OpenAI Agents SDK),
``pydantic_ai`` (Pydantic AI) and ``langgraph`` (LangGraph, and LangChain's agents built on it),
each with ``staged``, ``run``, ``resume`` and ``AgentRun`` (docs/adapters.md). Each is imported
on its own, with its framework's extra installed; this package imports no framework."""

from pending_actions.adapters.core import AgentRun, Applying, applying
from pending_actions.broker.errors import NotPaused

__all__ = ["AgentRun", "Applying", "NotPaused", "applying"]
