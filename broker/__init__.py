"""What producers and workers share: settings, key names, models, errors, Lua scripts and the
Redis/dramatiq setup."""

from pending_actions.broker.errors import (
    ConfigError,
    InvalidInput,
    PendingActionsError,
    RedisUnavailable,
    ScriptError,
    ToolError,
    UnknownHandler,
)
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import REMINDER, PendingAction, Result
from pending_actions.broker.settings import Settings

__all__ = [
    "REMINDER",
    "ConfigError",
    "InvalidInput",
    "Keys",
    "PendingAction",
    "PendingActionsError",
    "RedisUnavailable",
    "Result",
    "ScriptError",
    "Settings",
    "ToolError",
    "UnknownHandler",
]
