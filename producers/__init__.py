"""What an agent runtime imports: stage actions, resolve them, and the tool's face."""

from pending_actions.producers.aio import AsyncPendingActions
from pending_actions.producers.client import PendingActions
from pending_actions.producers.tool import (
    anthropic_tool,
    intent,
    openai_tool,
    render,
    soft_requirement,
    tool_definition,
)

__all__ = [
    "AsyncPendingActions",
    "PendingActions",
    "anthropic_tool",
    "intent",
    "openai_tool",
    "render",
    "soft_requirement",
    "tool_definition",
]
