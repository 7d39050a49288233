"""Handlers the tests run inside real dramatiq worker processes. Each records what it did in
Redis (``test:runs:<session>``) so tests can count runs across processes."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import threading
from typing import Any

import orjson
import redis

from pending_actions.broker.connection import blocking_client
from pending_actions.broker.errors import Stale, ToolError
from pending_actions.broker.models import PendingAction
from pending_actions.broker.urls import is_cluster_url
from pending_actions.workers import handler
from tests.support.runs import Run, runs_key


@functools.cache
def client() -> redis.Redis:
    """The worker's Redis (one server or a cluster), opened on first use: importing this module
    needs no environment. TEST_RECORD_URL: where a worker running as a least-privilege user
    records its runs."""
    # no socket timeout: t.gate blocks for up to a minute on purpose
    url = os.environ.get("TEST_RECORD_URL") or os.environ["PENDING_ACTIONS_REDIS_URL"]
    if is_cluster_url(url):
        return blocking_client(url, socket_timeout=None)
    return redis.Redis.from_url(url, socket_timeout=None)


def record(name: str, action: PendingAction, reason: str, extra: dict[str, Any] | None,
           key: str) -> None:
    run: Run = {"handler": name, "id": action.id, "attempt": action.attempts, "key": key,
                "reason": reason, "extra": extra, "payload": action.payload, "pid": os.getpid()}
    client().rpush(runs_key(action.session), orjson.dumps(run))


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
    """Fails while the attempt number is at most payload["fail_times"]: a ToolError, or with
    payload["crash"] any other error (which the worker logs)."""
    record("t.flaky", action, reason, extra, idempotency_key)
    if action.attempts <= int(action.payload.get("fail_times", 1)):
        error = RuntimeError if action.payload.get("crash") else ToolError
        raise error(f"flaky failure on attempt {action.attempts}")
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
    client().rpush(f"test:started:{action.session}", action.id)
    opened = client().blpop([action.payload["gate"]], timeout=60)
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
    client().eval(
        "if redis.call('SET', KEYS[1], ARGV[1], 'NX') then redis.call('RPUSH', KEYS[2], ARGV[1])"
        " end return 1", 2, f"test:effect:{{{action.session}}}:{idempotency_key}",
        f"test:effects:{{{action.session}}}",
        action.id)
    return f"done {action.id}"


@handler("t.error_result")
def error_result(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
                 idempotency_key: str) -> dict[str, Any]:
    """Returns an error result (it does not raise): an outcome, so the action is consumed."""
    record("t.error_result", action, reason, extra, idempotency_key)
    return {"content": "nothing to do: already applied", "is_error": True}


@handler("t.async")
async def async_ok(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
                   idempotency_key: str) -> dict[str, Any]:
    """An async def handler: awaits payload["sleep"] seconds on the worker thread's loop."""
    await asyncio.sleep(float(action.payload.get("sleep", 0)))
    loop = id(asyncio.get_running_loop())
    record("t.async", action, reason, extra, idempotency_key)
    return {"content": f"async {action.id}",
            "details": {"thread": threading.get_ident(), "loop": loop}}


@handler("t.async_toolerror")
async def async_toolerror(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
                          idempotency_key: str) -> str:
    await asyncio.sleep(0)
    record("t.async_toolerror", action, reason, extra, idempotency_key)
    raise ToolError("async refused")


@handler("t.stale")
def stale(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
          idempotency_key: str) -> str:
    """Raises Stale unless the payload's "current" equals the action's fingerprint."""
    record("t.stale", action, reason, extra, idempotency_key)
    if action.payload.get("current") != action.fingerprint:
        raise Stale(f"{action.payload.get('path', 'the target')} changed since the preview")
    return "fresh"


@handler("t.seen")
def seen(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> dict[str, Any]:
    """Answers with what it saw: payload, edited, fingerprint."""
    record("t.seen", action, reason, extra, idempotency_key)
    return {"content": "seen", "details": {"payload": action.payload, "edited": action.edited,
                                           "fingerprint": action.fingerprint}}
