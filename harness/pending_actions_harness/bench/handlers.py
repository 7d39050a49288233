"""The handler the benchmark's workers run: it does nothing, so what is measured is the
service's own path (request, take, dispatch, claim, finalize, reply)."""

from __future__ import annotations

from typing import Any

from pending_actions.broker.models import PendingAction
from pending_actions.workers import handler

NOOP = "bench.noop"


@handler(NOOP)
def noop(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> str:
    return "ok"
