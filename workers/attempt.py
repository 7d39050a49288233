"""One handler run: claim the attempt, run apply or reject, then finalize or re-add, every step
fenced by the lease token. Called by the dramatiq actor in ``pending_actions.workers.actors``."""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

import orjson
import redis
from pydantic import ValidationError
from redis.exceptions import NoScriptError

from pending_actions.broker import failpoints, texts
from pending_actions.broker.backoff import Backoff, retry
from pending_actions.broker.connection import NotReplicated, acked, is_cluster
from pending_actions.broker.context import Context
from pending_actions.broker.errors import Stale, ToolError
from pending_actions.broker.events import Event
from pending_actions.broker.failures import poison_of
from pending_actions.broker.feed import publish
from pending_actions.broker.loops import Beats, Loop
from pending_actions.broker.models import Lease, PendingAction, Result, Spec
from pending_actions.broker.payloads import check_payload
from pending_actions.broker.replies import BeginStatus, Begun, Concluded
from pending_actions.broker.results import base_details, from_handler, text_result
from pending_actions.broker.scripts import Call, Queued
from pending_actions.broker.tasks import TaskMessage
from pending_actions.workers import aio, registry
from pending_actions.workers.early import Claimed
from pending_actions.workers.poison import park_poison, park_spec

log = logging.getLogger("pending_actions.attempt")
R = TypeVar("R")

try:  # dramatiq interrupts a thread (time limit, shutdown) with a BaseException subclass
    from dramatiq.middleware import Interrupt
except ImportError:  # pragma: no cover
    Interrupt = Exception  # type: ignore[misc,assignment]


class Renewer:
    """Extends the lease of every running attempt of this process, every lease/3: a loop of
    ``broker.loops`` (it beats, and survives every error, Redis full included)."""

    def __init__(self, ctx: Context, beats: Beats | None = None) -> None:
        self.ctx = ctx
        self.beats = beats
        self.tokens: dict[str, str] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self.lock:
            if self.thread is not None:
                return
            lease_s = self.ctx.settings.lease_ms / 1000
            # a renewal late by a lease loses the lease: back off at most a sixth of one
            loop = Loop("lease-renewer", self._renew, self.wake, pause_s=lease_s / 3,
                        every_s=lease_s, beats=self.beats, backoff=Backoff(0.02, lease_s / 6))
            self.thread = loop.thread()
            self.thread.start()

    def add(self, session: str, token: str) -> None:
        with self.lock:
            self.tokens[token] = session
        self.start()

    def discard(self, token: str) -> None:
        with self.lock:
            self.tokens.pop(token, None)

    def _renew(self) -> None:
        with self.lock:
            items = list(self.tokens.items())
        if not items:
            return
        ctx = self.ctx
        pipe = ctx.client.pipeline(transaction=False)
        # renew.lua moves the lease's index entry too
        renewals = [ctx.scripts.renew(session, token=token).on(pipe) for token, session in items]
        replies = pipe.execute(raise_on_error=False)
        failed = [r for r in replies if isinstance(r, Exception)]
        for (token, session), queued in zip(items, renewals, strict=True):
            if poison_of(replies[queued.index]) is not None:
                # recovery parks it when it comes due; renewing it again cannot help
                log.error("lease %s of %s does not parse; no longer renewed", token, session)
                self.discard(token)
        if failed and any(poison_of(r) is None for r in failed):
            raise next(r for r in failed if poison_of(r) is None)


def _own(queued: Queued[R]) -> Callable[[list[Any]], R]:
    """A reader of ``queued``'s reply that raises the reply's own error (other replies of the
    pipeline may have failed; they are weighed by whoever reads them)."""
    def read(replies: list[Any]) -> R:
        if isinstance(replies[queued.index], Exception):
            raise replies[queued.index]
        return queued.get(replies)
    return read


def _outcome(replies: list[Any], done: Queued[Concluded], session: str) -> bool:
    recorded = _own(done)(replies).recorded
    failed = [r for r in replies if isinstance(r, Exception)]
    if failed:
        log.warning("outcome of %s recorded; its feed entry or ack was refused: %s",
                    session, failed[0])
    return recorded


def idempotency_key(spec: Spec, req: str) -> str:
    # An action's id is unique for ever, so it keys all its attempts. A standing handler serves
    # many resolves under one id, so each resolve request is its own unit of work.
    return f"{spec.id}:{req}" if spec.kind == "standing" else spec.id


FAILOVER_WAIT_S = 10.0
Settle = Callable[[Any], None]  # queues the task message's own ack on the outcome's pipeline


def run_attempt(ctx: Context, renewer: Renewer, task: TaskMessage,
                settle: Settle | None = None, early: Claimed | None = None) -> str:
    """Returns what happened, for logs and tests: applied, discarded, failed, stale, duplicate.
    ``settle``, when given, rides on the outcome's round trip (the task's ack). ``early``: the
    claim the consumer thread sent for this task (``workers/early.py``)."""
    budget = ctx.settings.lease_ms / 1000
    if ctx.settings.replica_wait:  # a step sent again through a failover, which takes seconds
        budget = max(budget, FAILOVER_WAIT_S)
    session, token, req, action = task.session, task.token, task.req, task.action
    # with REPLICA_WAIT, the claim is on a replica before the handler runs (so a failover
    # cannot forget the take and run the action again), and so is the outcome before this
    # attempt is over (a lost outcome is sent again, to the new master, while the lease holds)
    where, replicas = ctx.keys.inflight(session), ctx.settings.replica_wait
    wait_ms = ctx.settings.replica_wait_timeout_ms

    claimant = early.claimant if early is not None else uuid.uuid4().hex
    # scripts by digest (their bodies are KBs Redis would hash at every call), but where a
    # replica must confirm: WAIT covers a pipeline's own writes, not a body sent again after
    digest = not replicas

    def loaded(send: Callable[[], R]) -> Callable[[], R]:
        """``send``, again once Redis has our scripts back if it lost them (NOSCRIPT: that
        script did not run; the rest of its pipeline is safe to send twice)."""
        def again() -> R:
            try:
                return send()
            except NoScriptError:
                ctx.scripts.load_all()
                return send()
        return again

    def claim() -> Begun:
        # a claim not yet on a replica (NotReplicated) is sent again by retry(): the same
        # claimant is told OK again where its claim holds, and a master that took over without
        # it says whether another delivery claimed the attempt meanwhile (RUNNING)
        def build(pipe: Any) -> Callable[[list[Any]], Begun]:
            return _own(ctx.scripts.begin(session, token=token, claimant=claimant).on(
                pipe, by_digest=digest))

        return acked(ctx.client, where, build, replicas, wait_ms, raise_on_error=False,
                     own=True)

    # the feed is on another slot: on a cluster, where the outcome's pipeline goes straight to
    # the session's master, it follows in a round trip of its own
    direct = is_cluster(ctx.client)

    def conclude(step: Call[Concluded], event: Event | None = None,
                 spec: Spec | None = None, by: str = "") -> bool:
        # the outcome (which also ends the lease's index entry), the task's ack and the feed
        # entry: one round trip
        recorded = False

        def build(pipe: Any) -> Callable[[list[Any]], bool]:
            done = step.on(pipe, by_digest=digest)
            if event is not None and not direct:
                publish(pipe, ctx.keys, event, spec, by=by)
            if settle is not None:
                settle(pipe)
            # the outcome is what matters; a feed entry refused (Redis full) is logged, not
            # retried (the ack is too, see taskbroker: a redelivery is fenced by the token)
            return lambda replies: _outcome(replies, done, session)

        def send() -> bool:
            # an outcome recorded on a master that then failed to replicate it is sent again
            # (to the new master, where the lease still holds); on the same master the second
            # one finds the lease gone, which is no refusal of ours
            nonlocal recorded
            try:
                return (acked(ctx.client, where, build, replicas, wait_ms, raise_on_error=False,
                              own=True) or recorded)
            except NotReplicated as exc:
                recorded = recorded or bool(exc.result)
                raise

        done = retry(loaded(send), budget)
        if event is not None and direct:
            retry(lambda: publish(ctx.client, ctx.keys, event, spec, by=by), budget)
        return done

    if early is None:  # else hit on the consumer thread, before its claim
        failpoints.hit("before-begin", ctx.client, ctx.keys)
    try:
        # an early claim that waited a third of its lease is sent again, which extends it
        answer = early.begun() if early is not None else None
        if answer is not None and early is not None and (
                time.monotonic() - early.at < ctx.settings.lease_ms / 3000):
            begun = answer
        else:
            begun = retry(loaded(claim), budget)
    except (redis.ResponseError, ValidationError) as exc:
        return _unreadable(ctx, task, exc)
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
        conclude(ctx.scripts.readd(session, token=token, req=req, last_error="replaced",
                                   reply=reply.to_json(), action_id=begun.lease.id,
                                   attempt=begun.lease.attempt))
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
            done = conclude(ctx.scripts.readd(session, token=token, req=req,
                                              last_error=result.text, reply=result.to_json(),
                                              action_id=spec.id, attempt=view.attempts),
                            outcome, spec, by)
        else:  # an outcome that consumes: returned (error results too), stale, a failed directive
            done = conclude(ctx.scripts.finalize(session, token=token, req=req,
                                                 reply=result.to_json(), event=outcome,
                                                 action_id=spec.id, attempt=view.attempts,
                                                 noted=noted),
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


def _unreadable(ctx: Context, task: TaskMessage, exc: Exception) -> str:
    """begin found a record of this attempt that does not parse: park it, tell the resolver,
    run nothing. Anything else Redis refused goes to the caller (dramatiq's retry)."""
    reply = text_result(f"Could not resolve: {exc}; it was moved to the session's dead "
                        "letters", base_details(task.action, task.reason, task.extra),
                        is_error=True).to_json()
    if isinstance(exc, ValidationError):  # the spec is JSON, but not a spec we can read
        lease = ctx.client.hget(ctx.keys.inflight(task.session), task.token)
        try:
            action_id = Lease.model_validate_json(lease).id if lease else ""
        except ValidationError:
            action_id = ""
        raw = ctx.client.hget(ctx.keys.actions(task.session), action_id) if action_id else None
        if isinstance(raw, bytes):
            park_spec(ctx, task.session, action_id, raw, f"spec does not parse: {exc}"[:500],
                      req=task.req, reply=reply, token=task.token)
        return "parked"
    found = poison_of(exc)
    if found is None:
        raise exc
    park_poison(ctx, task.session, found, task.req, reply, task.token)
    return "parked"


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
