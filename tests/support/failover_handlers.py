"""The handler of the failover test: records every run in a Redis outside the cluster (what a
failover of the cluster cannot lose), with no idempotency of its own, so a second run of one
action shows."""

from __future__ import annotations

import os
from typing import Any

import redis

from pending_actions.broker.models import PendingAction
from pending_actions.workers import handler

RUNS = "fo:runs"
_record: list[redis.Redis] = []  # made in the worker, where TEST_RECORD_URL is set


@handler("fo.apply")
def apply(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
          idempotency_key: str) -> str:
    if not _record:
        _record.append(redis.Redis.from_url(os.environ["TEST_RECORD_URL"]))
    _record[0].rpush(RUNS, f"{action.session}/{action.id}")
    return f"applied {action.id}"
