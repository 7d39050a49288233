"""Handlers of worker fleet B in the mixed-fleet test: only ``mix.b``."""

from __future__ import annotations

import os
from typing import Any

import redis

from pending_actions.broker.connection import blocking_client
from pending_actions.broker.models import PendingAction
from pending_actions.broker.urls import is_cluster_url
from pending_actions.workers import handler

_url = os.environ["PENDING_ACTIONS_REDIS_URL"]
_client = blocking_client(_url) if is_cluster_url(_url) else redis.Redis.from_url(_url)


@handler("mix.b")
def run_b(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
          idempotency_key: str) -> str:
    _client.rpush(f"test:mix:{action.session}", f"b:{action.id}")
    return f"b ran {action.id}"
