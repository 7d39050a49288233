"""What an agent runtime imports: stage actions, resolve them, and the tool's face."""

from pending_actions.producers.client import PendingActions
from pending_actions.producers.tool import intent, render, soft_requirement, tool_definition

__all__ = ["PendingActions", "intent", "render", "soft_requirement", "tool_definition"]
