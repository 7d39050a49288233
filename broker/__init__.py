"""What producers and workers share: settings, key names, models, errors, Lua scripts and the
Redis/dramatiq setup."""

from broker.errors import (
    ConfigError,
    InvalidInput,
    PendingActionsError,
    RedisUnavailable,
    ScriptError,
    ToolError,
    UnknownHandler,
)
from broker.keys import Keys
from broker.models import REMINDER, PendingAction, Result
from broker.settings import Settings

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
