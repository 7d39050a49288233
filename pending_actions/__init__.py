"""pending-actions: stage, approve and apply AI agent tool actions across processes.

The public names live here; the parts are ``pending_actions.broker`` (what both sides share),
``pending_actions.producers`` (what an agent runtime imports) and ``pending_actions.workers``
(the resolve worker and the handler runners). Importing this package never imports dramatiq.
"""

from pending_actions.broker.errors import (
    ConfigError,
    Damaged,
    Denied,
    Forbidden,
    InvalidInput,
    NotPaused,
    PendingActionsError,
    RedisFull,
    RedisUnavailable,
    Stale,
    ToolError,
    UnknownHandler,
    Unowned,
)
from pending_actions.broker.models import PendingAction, Result
from pending_actions.broker.settings import Settings
from pending_actions.producers import (
    AsyncPendingActions,
    PendingActions,
    anthropic_tool,
    intent,
    openai_tool,
    render,
    soft_requirement,
    tool_definition,
)
from pending_actions.workers.registry import handler

__all__ = [
    "AsyncPendingActions",
    "ConfigError",
    "Damaged",
    "Denied",
    "Forbidden",
    "InvalidInput",
    "NotPaused",
    "PendingAction",
    "PendingActions",
    "PendingActionsError",
    "RedisFull",
    "RedisUnavailable",
    "Result",
    "Settings",
    "Stale",
    "ToolError",
    "UnknownHandler",
    "Unowned",
    "anthropic_tool",
    "handler",
    "intent",
    "openai_tool",
    "render",
    "soft_requirement",
    "tool_definition",
]
