"""The handlers of ``tests.support.handlers``, plus ``t.starve``: it takes every connection its
worker process's Redis pool will give and keeps them, as a leak would, leaving the process's
loops none."""

from __future__ import annotations

from typing import Any

import tests.support.handlers  # noqa: F401  (registers the handlers)
from pending_actions.broker.models import PendingAction
from pending_actions.broker.roundtrips import own_connection
from pending_actions.workers import actors, handler

HELD: list[Any] = []  # never given back


@handler("t.starve")
def starve(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
           idempotency_key: str) -> str:
    pool: Any = actors.ctx.client.connection_pool
    own_connection(actors.ctx.client)  # this thread's own first: it records the outcome
    # all it gives without waiting (its wait would outlast this attempt's lease, whose
    # renewals find no connection either)
    while pool._available_connections or pool._created_connections < pool.max_connections:
        HELD.append(pool.get_connection())
    return f"holding {len(HELD)} connections"
