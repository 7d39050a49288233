"""One handler run: claim the attempt, run apply or reject, then finalize or re-add, every step
fenced by the lease token. Called by the dramatiq actor in ``pending_actions.workers.actors``."""

from __future__ import annotations

import inspect
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import orjson

from pending_actions.broker import failpoints, texts
from pending_actions.broker.backoff import retry
from pending_actions.broker.connection import TRANSIENT, NotReplicated, acked, is_cluster
from pending_actions.broker.context import Context
from pending_actions.broker.errors import Stale, ToolError
from pending_actions.broker.events import Event
from pending_actions.broker.feed import publish
from pending_actions.broker.models import PendingAction, Result, Spec
from pending_actions.broker.payloads import check_payload
from pending_actions.broker.replies import BeginStatus, Begun, Concluded
from pending_actions.broker.results import base_details, from_handler, text_result
from pending_actions.broker.scripts import Call
from pending_actions.broker.tasks import TaskMessage
from pending_actions.workers import aio, registry

log = logging.getLogger("pending_actions.attempt")

try:  # dramatiq interrupts a thread (time limit, shutdown) with a BaseException subclass
    from dramatiq.middleware import Interrupt
except ImportError:  # pragma: no cover
    Interrupt = Exception  # type: ignore[misc,assignment]


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
                pipe = self.ctx.client.pipeline(transaction=False)
                for token, session in items:
                    self.ctx.scripts.renew(session, token).on(pipe)
                pipe.execute()
            except TRANSIENT as exc:
                log.warning("lease renewal failed (%s); retrying", exc)


def idempotency_key(spec: Spec, req: str) -> str:
    # An action's id is unique for ever, so it keys all its attempts. A standing handler serves
    # many resolves under one id, so each resolve request is its own unit of work.
    return f"{spec.id}:{req}" if spec.kind == "standing" else spec.id


FAILOVER_WAIT_S = 10.0
Settle = Callable[[Any], None]  # queues the task message's own ack on the outcome's pipeline


def run_attempt(ctx: Context, renewer: Renewer, task: TaskMessage,
                settle: Settle | None = None) -> str:
    """Returns what happened, for logs and tests: applied, discarded, failed, stale, duplicate.
    ``settle``, when given, rides on the outcome's round trip (the task's ack)."""
    budget = ctx.settings.lease_ms / 1000
    if ctx.settings.replica_wait:  # a step sent again through a failover, which takes seconds
        budget = max(budget, FAILOVER_WAIT_S)
    session, token, req, action = task.session, task.token, task.req, task.action
    # with REPLICA_WAIT, the claim is on a replica before the handler runs (so a failover
    # cannot forget the take and run the action again), and so is the outcome before this
    # attempt is over (a lost outcome is sent again, to the new master, while the lease holds)
    where, replicas = ctx.keys.inflight(session), ctx.settings.replica_wait
    wait_ms = ctx.settings.replica_wait_timeout_ms

    claimant = uuid.uuid4().hex

    def claim() -> Begun:
        # a claim not yet on a replica (NotReplicated) is sent again by retry(): the same
        # claimant is told OK again where its claim holds, and a master that took over without
        # it says whether another delivery claimed the attempt meanwhile (RUNNING)
        def build(pipe: Any) -> Callable[[list[Any]], Begun]:
            return ctx.scripts.begin(session, token, claimant).on(pipe).get

        return acked(ctx.client, where, build, replicas, wait_ms)

    # the feed is on another slot: on a cluster, a pipeline that WAITs on the session's master
    # cannot carry it, so it follows in a round trip of its own there
    direct = bool(replicas) and is_cluster(ctx.client)

    def conclude(step: Call[Concluded], event: Event | None = None,
                 spec: Spec | None = None, by: str = "") -> bool:
        # the outcome (which also ends the lease's index entry), the task's ack and the feed
        # entry: one round trip
        recorded = False

        def build(pipe: Any) -> Callable[[list[Any]], bool]:
            done = step.on(pipe)
            if event is not None and not direct:
                publish(pipe, ctx.keys, event, spec, by=by)
            if settle is not None:
                settle(pipe)
            return lambda replies: done.get(replies).recorded

        def send() -> bool:
            # an outcome recorded on a master that then failed to replicate it is sent again
            # (to the new master, where the lease still holds); on the same master the second
            # one finds the lease gone, which is no refusal of ours
            nonlocal recorded
            try:
                return acked(ctx.client, where, build, replicas, wait_ms) or recorded
            except NotReplicated as exc:
                recorded = recorded or bool(exc.result)
                raise

        done = retry(send, budget)
        if event is not None and direct:
            retry(lambda: publish(ctx.client, ctx.keys, event, spec, by=by), budget)
        return done

    failpoints.hit("before-begin", ctx.client, ctx.keys)
    begun = retry(claim, budget)
    if begun.status is BeginStatus.STALE:
        # routine: the task of a resolve that found nothing to target ends here too
        log.debug("attempt %s of %s is no longer leased; nothing run", token, session)
        return "stale"
    if begun.status is BeginStatus.RUNNING:
        log.info("duplicate delivery of attempt %s; nothing run", token)
        return "duplicate"
    assert begun.lease is not None
    if begun.status is BeginStatus.GONE:
        reply = text_result(texts.REPLACED, base_details(action, task.reason, task.extra),
                            is_error=True)
        conclude(ctx.scripts.readd(session, token, req, "replaced", reply.to_json(),
                                   begun.lease.id, begun.lease.attempt))
        return "failed"
    assert begun.spec is not None and begun.counters is not None
    spec = begun.spec
    view = PendingAction.build(spec, begun.counters, "in_flight", task.edit)
    # renewed until the outcome is recorded, not only while the handler runs: an outcome sent
    # again through a failover must find its lease still held
    renewer.add(session, token)
    try:
        ran = _call(view, spec, task, idempotency_key(spec, req))
        result, outcome, noted = ran.result, _event(ran, action, spec), _noted(ran, spec, task)
        by = begun.lease.by
        if outcome is Event.FAILED and spec.kind != "directive":
            done = conclude(ctx.scripts.readd(session, token, req, result.text,
                                              result.to_json(), spec.id, view.attempts),
                            outcome, spec, by)
        else:  # an outcome that consumes: returned (error results too), stale, a failed directive
            done = conclude(ctx.scripts.finalize(session, token, req, result.to_json(),
                                                 outcome, spec.id, view.attempts, noted),
                            outcome, spec, by)
    finally:
        renewer.discard(token)
    if not done:
        retry(lambda: publish(ctx.client, ctx.keys, Event.LATE_REFUSED, spec,
                              outcome=outcome.value), budget)
        log.warning("late outcome of %s (attempt %s) refused: its lease had expired",
                    spec.id, view.attempts)
        return "stale"
    return outcome.value


class Ran(NamedTuple):
    """A handler's run: its result, and how it ended: ``returned`` (what it returned, an error
    result included), ``raised`` (pending again) or ``stale`` (it raised Stale)."""

    result: Result
    how: Literal["returned", "raised", "stale"]


def _event(ran: Ran, action: str, spec: Spec) -> Event:
    if ran.how == "stale":
        return Event.STALE
    if ran.how == "raised":
        return Event.FAILED
    return Event.APPLIED if action == "apply" else Event.DISCARDED


def _noted(ran: Ran, spec: Spec, task: TaskMessage) -> tuple[str, ...]:
    """What the outcome's history entry adds: the error text of an error result, and an
    edit's patch beside the payload it was applied to."""
    noted: tuple[str, ...] = ("error", ran.result.text) if ran.result.is_error else ()
    if task.edit is not None:
        noted += ("edit", orjson.dumps(task.edit).decode(),
                  "payload", orjson.dumps(spec.payload).decode())
    return noted


def _call(view: PendingAction, spec: Spec, task: TaskMessage, key: str) -> Ran:
    action, reason, extra = task.action, task.reason, task.extra
    name = spec.apply if action == "apply" else spec.reject
    details = base_details(action, reason, extra, spec)
    if task.edit is not None:
        details["edit"] = task.edit

    def returned(value: object) -> Ran:
        result = from_handler(value, action, spec, reason, extra)
        if task.edit is not None:
            result.details["edit"] = task.edit
        return Ran(result, "returned")

    try:
        if name is None:  # discard without a reject handler
            return returned(None)
        fn = registry.get(name)
        if fn is None:
            raise LookupError(f"no handler named {name!r} in this worker")
        if task.edit is not None:
            # the producer checked it already; this guards a request written by hand
            check_payload(view.payload, spec.payload_schema, "edit")
        value = fn(action=view, reason=reason, extra=extra, idempotency_key=key)
        if inspect.isawaitable(value):
            value = aio.run(value)
        return returned(value)
    except Stale as exc:
        return Ran(text_result(texts.stale(str(exc) or "the preview is out of date"), details,
                               is_error=True), "stale")
    except ToolError as exc:
        return Ran(text_result(str(exc), details, is_error=True), "raised")
    except (Exception, Interrupt) as exc:
        message = str(exc) or type(exc).__name__
        log.info("handler %s for %s failed: %s", name, spec.id, message)
        return Ran(text_result(texts.handler_failed(action, message), details, is_error=True),
                   "raised")
