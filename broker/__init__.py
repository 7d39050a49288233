"""What producers and workers share: settings, key names, models, errors, Lua scripts and the
Redis setup (the dramatiq side is the workers': ``workers/tasks.py``, ``workers/taskbroker.py``)."""

from pending_actions.broker.errors import (
    ConfigError,
    InvalidInput,
    PendingActionsError,
    RedisUnavailable,
    Stale,
    ToolError,
    UnknownHandler,
)
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import PendingAction, Result
from pending_actions.broker.settings import Settings
from pending_actions.broker.texts import REMINDER

__all__ = [
    "REMINDER",
    "ConfigError",
    "InvalidInput",
    "Keys",
    "PendingAction",
    "PendingActionsError",
    "RedisUnavailable",
    "Result",
    "Settings",
    "Stale",
    "ToolError",
    "UnknownHandler",
]
