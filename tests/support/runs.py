"""What the test handlers (``tests.support.handlers``) record of every run, in Redis, so that
tests can count runs across processes: written there, read here."""

from __future__ import annotations

from typing import Any, TypedDict

import orjson
import redis

from tests.support.replies import byte_list


class Run(TypedDict):
    handler: str
    id: str
    attempt: int
    key: str  # the idempotency key
    reason: str
    extra: dict[str, Any] | None
    payload: dict[str, Any]
    pid: int


def runs_key(session: str) -> str:
    return f"test:runs:{session}"


def runs(rc: redis.Redis, session: str) -> list[Run]:
    """Every recorded run of the session's handlers, oldest first."""
    out: list[Run] = [orjson.loads(x) for x in byte_list(rc.lrange(runs_key(session), 0, -1))]
    return out
