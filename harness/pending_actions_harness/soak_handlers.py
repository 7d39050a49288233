"""Handlers for ``pending-actions soak``: random ToolErrors, occasional slow runs, and an
idempotent effect keyed by the idempotency key, as the contract asks handlers to make."""

from __future__ import annotations

import functools
import os
import random
import time
from typing import Any

import redis
from redis.commands.core import Script

from pending_actions.broker.errors import ToolError
from pending_actions.broker.models import PendingAction
from pending_actions.workers.registry import handler


@functools.cache
def _effect() -> Script:
    """Opened on first use, so that importing this module needs no environment."""
    client = redis.Redis.from_url(os.environ["PENDING_ACTIONS_REDIS_URL"])
    return client.register_script(
        "if redis.call('SET', KEYS[1], '1', 'NX') then redis.call('HINCRBY', KEYS[2], ARGV[1],"
        " 1) end redis.call('HINCRBY', KEYS[3], ARGV[1], 1) return 1")


@handler("soak.apply")
def apply(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
          idempotency_key: str) -> str:
    if random.random() < float(action.payload.get("fail_rate", 0.0)):
        raise ToolError(f"random failure on attempt {action.attempts}")
    if random.random() < 0.02:
        time.sleep(random.uniform(0.1, 1.0))  # a slow handler, so kills land mid-run
    # effects: once per idempotency key; completions: every successful handler run
    _effect()(keys=[f"soak:effect:{idempotency_key}", "soak:effects", "soak:completions"],
            args=[action.id])
    return f"applied {action.id}"


@handler("soak.reject")
def reject(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
           idempotency_key: str) -> None:
    return None
