"""Handlers the tests run inside real dramatiq worker processes. Each records what it did in
Redis (``test:runs:<session>``) so tests can count runs across processes."""

from __future__ import annotations

import os
import signal
from typing import Any

import orjson
import redis

from pending_actions.broker.errors import ToolError
from pending_actions.broker.models import PendingAction
from pending_actions.workers import handler
from tests.procs import runs_key

# no socket timeout: t.gate blocks for up to a minute on purpose
# (TEST_RECORD_URL: where a worker running as a least-privilege user records its runs)
_client = redis.Redis.from_url(
    os.environ.get("TEST_RECORD_URL") or os.environ["PENDING_ACTIONS_REDIS_URL"],
    socket_timeout=None)


def record(name: str, action: PendingAction, reason: str, extra: dict[str, Any] | None,
           key: str) -> None:
    _client.rpush(runs_key(action.session), orjson.dumps({
        "handler": name, "id": action.id, "attempt": action.attempts, "key": key,
        "reason": reason, "extra": extra, "payload": action.payload, "pid": os.getpid(),
    }))


@handler("t.ok")
def ok(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
       idempotency_key: str) -> str:
    record("t.ok", action, reason, extra, idempotency_key)
    return f"applied {action.id}"


@handler("t.details")
def details(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
            idempotency_key: str) -> dict[str, Any]:
    record("t.details", action, reason, extra, idempotency_key)
    return {"content": [{"type": "text", "text": "with details"}],
            "details": {"files": ["a.py"], "echo": extra}}


@handler("t.none")
def none(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> None:
    record("t.none", action, reason, extra, idempotency_key)


@handler("t.toolerror")
def toolerror(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
              idempotency_key: str) -> str:
    record("t.toolerror", action, reason, extra, idempotency_key)
    raise ToolError(f"refused: {action.payload.get('why', 'no reason')}")


@handler("t.boom")
def boom(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> str:
    record("t.boom", action, reason, extra, idempotency_key)
    raise ValueError("kaput")


@handler("t.flaky")
def flaky(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
          idempotency_key: str) -> str:
    """Fails while the attempt number is at most payload["fail_times"]."""
    record("t.flaky", action, reason, extra, idempotency_key)
    if action.attempts <= int(action.payload.get("fail_times", 1)):
        raise ToolError(f"flaky failure on attempt {action.attempts}")
    return f"flaky ok on attempt {action.attempts}"


@handler("t.reject_text")
def reject_text(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
                idempotency_key: str) -> str:
    record("t.reject_text", action, reason, extra, idempotency_key)
    return f"rejected {action.label} because {reason}"


@handler("t.reject_raise")
def reject_raise(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
                 idempotency_key: str) -> str:
    record("t.reject_raise", action, reason, extra, idempotency_key)
    raise RuntimeError("reject broke")


@handler("t.gate")
def gate(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> str:
    """Says it started, then waits until the test opens its gate (payload["gate"])."""
    record("t.gate:start", action, reason, extra, idempotency_key)
    _client.rpush(f"test:started:{action.session}", action.id)
    opened = _client.blpop([action.payload["gate"]], timeout=60)
    if opened is None:
        raise ToolError("gate never opened")
    record("t.gate", action, reason, extra, idempotency_key)
    return f"gated {action.id} done"


@handler("t.crash")
def crash(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
          idempotency_key: str) -> str:
    """Kills its own worker process, every time."""
    record("t.crash", action, reason, extra, idempotency_key)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


@handler("t.idem")
def idem(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> str:
    """Makes its effect exactly once with the idempotency key, as the contract asks handlers to:
    ``test:effects:<session>`` gets each action id once however often it is attempted."""
    record("t.idem", action, reason, extra, idempotency_key)
    # one atomic step, so a retried call after a lost reply cannot lose or double the effect
    _client.eval(
        "if redis.call('SET', KEYS[1], ARGV[1], 'NX') then redis.call('RPUSH', KEYS[2], ARGV[1])"
        " end return 1", 2, f"test:effect:{idempotency_key}", f"test:effects:{action.session}",
        action.id)
    return f"done {action.id}"
