"""One handler run: claim the attempt, run apply or reject, then finalize or re-add, every step
fenced by the lease token. Called by the dramatiq actor in ``pending_actions.workers.actors``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pending_actions.broker import failpoints
from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.context import Context
from pending_actions.broker.errors import ToolError
from pending_actions.broker.models import ActionState, Lease, PendingAction, Result, Spec
from pending_actions.broker.results import base_details, from_handler, text_result
from pending_actions.workers import registry

log = logging.getLogger("pending_actions.attempt")
T = TypeVar("T")

try:  # dramatiq interrupts a thread (time limit, shutdown) with a BaseException subclass
    from dramatiq.middleware import Interrupt
except ImportError:  # pragma: no cover
    Interrupt = Exception  # type: ignore[misc,assignment]


def retrying(fn: Callable[[], T], budget_s: float) -> T:
    """Retry a Redis call through an outage for up to ``budget_s``; past that the lease runs
    out anyway and recovery takes over."""
    deadline = time.monotonic() + budget_s
    delay = 0.05
    while True:
        try:
            return fn()
        except TRANSIENT:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class Renewer:
    """Extends the lease of every running attempt of this process, every lease/3."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.tokens: dict[str, str] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, session: str, token: str) -> None:
        with self.lock:
            self.tokens[token] = session
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self.thread.start()

    def discard(self, token: str) -> None:
        with self.lock:
            self.tokens.pop(token, None)

    def _run(self) -> None:
        interval = self.ctx.settings.lease_ms / 3000
        while not self.wake.wait(interval):
            with self.lock:
                items = list(self.tokens.items())
            if not items:
                continue
            try:
                ctx = self.ctx
                pipe = ctx.client.pipeline(transaction=False)
                deadline = time.time() * 1000 + ctx.settings.lease_ms
                for token, session in items:
                    ctx.scripts.renew(session, token, client=pipe)
                    # GT: only ever later; XX: a finished lease's entry stays gone
                    pipe.zadd(ctx.keys.leases, {ctx.keys.lease_member(session, token): deadline},
                              xx=True, gt=True)
                pipe.execute()
            except TRANSIENT as exc:
                log.warning("lease renewal failed (%s); retrying", exc)


def idempotency_key(spec: Spec, req: str) -> str:
    # An action's id is unique for ever, so it keys all its attempts. A standing handler serves
    # many resolves under one id, so each resolve request is its own unit of work.
    return f"{spec.id}:{req}" if spec.kind == "standing" else spec.id


Settle = Callable[[Any], None]  # queues the task message's own ack on the outcome's pipeline


def run_attempt(ctx: Context, renewer: Renewer, session: str, token: str, req: str,
                action: str, reason: str, extra: dict[str, Any] | None,
                settle: Settle | None = None) -> str:
    """Returns what happened, for logs and tests: applied, discarded, failed, stale, duplicate.
    ``settle``, when given, rides on the outcome's round trip (the task's ack)."""
    budget = ctx.settings.lease_ms / 1000
    member = ctx.keys.lease_member(session, token)

    def claim() -> Any:
        # one round trip: claim the attempt and bring its index entry down to the (shorter)
        # running lease; LT never raises it, XX never revives an entry recovery removed
        pipe = ctx.client.pipeline(transaction=False)
        ctx.scripts.begin(session, token, client=pipe)
        pipe.zadd(ctx.keys.leases, {member: time.time() * 1000 + ctx.settings.lease_ms},
                  xx=True, lt=True)
        return pipe.execute()[0]

    def conclude(step: Callable[[Any], Any]) -> int:
        # the outcome, the end of the lease's index entry and the task's ack: one round trip
        pipe = ctx.client.pipeline(transaction=False)
        step(pipe)
        pipe.zrem(ctx.keys.leases, member)
        if settle is not None:
            settle(pipe)
        return int(pipe.execute()[0])

    failpoints.hit("before-begin", ctx.client, ctx.keys)
    got = retrying(claim, budget)
    status = got[0].decode()
    if status == "stale":
        # routine: the task of a resolve that found nothing to target ends here too
        log.debug("attempt %s of %s is no longer leased; nothing run", token, session)
        return "stale"
    if status == "running":
        log.info("duplicate delivery of attempt %s; nothing run", token)
        return "duplicate"
    if status == "gone":
        lease = Lease.model_validate_json(got[1])
        reply = text_result("The target was replaced before it ran; nothing was done.",
                            base_details(action, reason, extra), is_error=True)
        retrying(lambda: conclude(lambda p: ctx.scripts.readd(
            session, token, req, "replaced", reply.to_json(), lease.id, lease.attempt,
            client=p)), budget)
        return "failed"
    spec = Spec.model_validate_json(got[1])
    view = PendingAction.build(spec, ActionState.model_validate_json(got[2]), "in_flight")
    name = spec.apply if action == "apply" else spec.reject
    renewer.add(session, token)
    try:
        result = _call(name, view, spec, action, reason, extra, idempotency_key(spec, req))
    finally:
        renewer.discard(token)
    if result.is_error:
        error = result.text
        done = retrying(lambda: conclude(lambda p: ctx.scripts.readd(
            session, token, req, error, result.to_json(), spec.id, view.attempts, client=p)),
            budget)
        outcome = "failed"
    else:
        event = "applied" if action == "apply" else "discarded"
        done = retrying(lambda: conclude(lambda p: ctx.scripts.finalize(
            session, token, req, result.to_json(), event, spec.id, view.attempts, client=p)),
            budget)
        outcome = event
    if not done:
        log.warning("late outcome of %s (attempt %s) refused: its lease had expired",
                    spec.id, view.attempts)
        return "stale"
    return outcome


def _call(name: str | None, view: PendingAction, spec: Spec, action: str, reason: str,
          extra: dict[str, Any] | None, key: str) -> Result:
    details = base_details(action, reason, extra, spec)
    try:
        if name is None:  # discard without a reject handler
            return from_handler(None, action, spec, reason, extra)
        fn = registry.get(name)
        if fn is None:
            raise LookupError(f"no handler named {name!r} in this worker")
        value = fn(action=view, reason=reason, extra=extra, idempotency_key=key)
        return from_handler(value, action, spec, reason, extra)
    except ToolError as exc:
        return text_result(str(exc), details, is_error=True)
    except (Exception, Interrupt) as exc:
        message = str(exc) or type(exc).__name__
        text = f"Apply failed: {message}" if action == "apply" else message
        log.info("handler %s for %s failed: %s", name, spec.id, message)
        return text_result(text, details, is_error=True)
