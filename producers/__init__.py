"""What an agent runtime imports: stage actions, resolve them, and the tool's face."""

# One import name, so one copy of every class (an ``except Stale`` catches every Stale): from
# the repo root ``producers`` is importable too, and is refused before it loads anything.
if __name__ != "pending_actions.producers":
    raise ImportError(f"import pending_actions.producers, not {__name__}", name=__name__)

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
