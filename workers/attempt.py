"""One handler run: claim the attempt, run apply or reject, then finalize or re-add, every step
fenced by the lease token (``Attempt``; ``workers/renewer.py`` keeps the lease). What a
handler's failure comes to is decided in one place, ``conclusion``. Called by the dramatiq actor
in ``pending_actions.workers.actors``."""

from __future__ import annotations

import inspect
import logging
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, NamedTuple, TypeVar, cast

import orjson
import redis
from pydantic import ValidationError
from redis.exceptions import NoScriptError

from pending_actions.broker import failpoints, texts, tracing
from pending_actions.broker.atomic.replies import BeginStatus, Begun, Concluded
from pending_actions.broker.atomic.scripts import Call, Queued
from pending_actions.broker.backoff import FAILOVER_WAIT_S, retry
from pending_actions.broker.connection import NotReplicated
from pending_actions.broker.context import Context
from pending_actions.broker.errors import Stale, ToolError
from pending_actions.broker.events import Event
from pending_actions.broker.failures import poison_of
from pending_actions.broker.feed import publish
from pending_actions.broker.models import (
    ActionState,
    Lease,
    PendingAction,
    ResolveAction,
    Result,
    Spec,
    merge_patch,
    patch_between,
)
from pending_actions.broker.payloads import check_payload
from pending_actions.broker.results import base_details, from_handler, text_result
from pending_actions.broker.roundtrips import acked
from pending_actions.workers import aio, registry
from pending_actions.workers.early import Claimed
from pending_actions.workers.poison import park_poison, park_spec
from pending_actions.workers.renewer import Renewer
from pending_actions.workers.tasks import TaskMessage

log = logging.getLogger("pending_actions.attempt")
R = TypeVar("R")

try:  # dramatiq interrupts a thread (time limit, shutdown) with a BaseException subclass
    from dramatiq.middleware import Interrupt
except ImportError:  # pragma: no cover
    Interrupt = Exception  # type: ignore[misc,assignment]


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


Settle = Callable[[Any], None]  # queues the task message's own ack on the outcome's pipeline


def run_attempt(ctx: Context, renewer: Renewer, task: TaskMessage,
                settle: Settle | None = None, early: Claimed | None = None,
                queued_at_ms: int | None = None) -> str:
    """Returns what happened, for logs and tests: applied, discarded, failed, stale, duplicate,
    parked. ``settle``, when given, rides on the outcome's round trip (the task's ack).
    ``early``: the claim the consumer thread sent for this task (``workers/early.py``).
    ``queued_at_ms``: when its task message was made (the span's time in the queue)."""
    attempt = Attempt(ctx, renewer, task, settle, early)
    started = tracing.now_ns()
    begun = attempt.claim()
    if not isinstance(begun, Begun):  # nothing to run
        return begun
    with tracing.handling(task.action, begun, started, queued_at_ms) as span:
        try:
            ran = attempt.run(begun)
            end, done = attempt.conclude(begun, ran)
        finally:
            renewer.discard(task.token)
        span.ended(end.event if done else Event.LATE_REFUSED, ran.error, end.readd and done)
        return end.event.value if done else attempt.refused_late(begun, end.event)


class Attempt:
    """One attempt of one resolve, in three steps, each fenced by the lease token: ``claim``
    it (begin.lua), ``run`` its handler, ``conclude`` it (finalize.lua or readd.lua, as
    ``conclusion`` decides)."""

    def __init__(self, ctx: Context, renewer: Renewer, task: TaskMessage,
                 settle: Settle | None = None, early: Claimed | None = None) -> None:
        self.ctx, self.renewer, self.task = ctx, renewer, task
        self.settle, self.early = settle, early
        settings = ctx.settings
        self.budget = settings.lease_ms / 1000
        if settings.replica_wait:  # a step sent again through a failover, which takes seconds
            self.budget = max(self.budget, FAILOVER_WAIT_S)
        # with REPLICA_WAIT, the claim is on a replica before the handler runs (so a failover
        # cannot forget the take and run the action again), and so is the outcome before the
        # attempt is over (a lost outcome is sent again, to the new master, while leased)
        self.where = ctx.keys.inflight(task.session)
        self.replicas, self.wait_ms = settings.replica_wait, settings.replica_wait_timeout_ms
        self.claimant = early.claimant if early is not None else uuid.uuid4().hex
        # scripts by digest (their bodies are KBs Redis would hash at every call), but where a
        # replica must confirm: WAIT covers a pipeline's own writes, not a body sent again after
        self.digest = not self.replicas
        self.recorded = False  # an outcome sent was recorded, whatever its replication

    # --- claim -----------------------------------------------------------------------------
    def claim(self) -> Begun | str:
        """The claim, answered OK (then run it), or what happened instead: the lease is gone
        (stale), another delivery runs it (duplicate), a record of it does not parse (parked),
        or its spec was replaced meanwhile (failed: re-added)."""
        ctx, task, early = self.ctx, self.task, self.early
        if early is None:  # else hit on the consumer thread, before its claim
            failpoints.hit("before-begin", ctx.client, ctx.keys)
        try:
            # an early claim that waited a third of its lease is sent again, which extends it
            answer = early.begun() if early is not None else None
            if answer is not None and early is not None and (
                    time.monotonic() - early.at < ctx.settings.lease_ms / 3000):
                begun = answer
            else:
                begun = retry(partial(self._loaded, self._send_claim), self.budget)
        except (redis.ResponseError, ValidationError) as exc:
            return _unreadable(ctx, task, exc)
        if begun.status is BeginStatus.STALE:
            # routine: the task of a resolve that found nothing to target ends here too
            log.debug("attempt %s of %s is no longer leased; nothing run", task.token,
                      task.session)
            return "stale"
        if begun.status is BeginStatus.RUNNING:
            log.info("duplicate delivery of attempt %s; nothing run", task.token)
            return "duplicate"
        assert begun.lease is not None
        if begun.status is BeginStatus.GONE:
            # a slot's target replaced meanwhile; an action's spec gone (readd.lua then
            # dead-letters it: it cannot go back)
            text = (texts.spec_missing(task.action, begun.lease.id)
                    if begun.lease.kind == "action" else texts.REPLACED)
            reply = text_result(text, base_details(task.action, task.reason, task.extra),
                                is_error=True)
            self._record(ctx.scripts.readd(
                task.session, token=task.token, req=task.req, last_error="replaced",
                reply=reply.to_json(), action_id=begun.lease.id, attempt=begun.lease.attempt))
            return "failed"
        return begun

    def _send_claim(self) -> Begun:
        # a claim not yet on a replica (NotReplicated) is sent again by retry(): the same
        # claimant is told OK again where its claim holds, and a master that took over without
        # it says whether another delivery claimed the attempt meanwhile (RUNNING)
        return acked(self.ctx.client, self.where, self._queue_claim, self.replicas,
                     self.wait_ms, raise_on_error=False, own=True)

    def _queue_claim(self, pipe: Any) -> Callable[[list[Any]], Begun]:
        task = self.task
        begin = self.ctx.scripts.begin(task.session, token=task.token, claimant=self.claimant)
        return _own(begin.on(pipe, by_digest=self.digest))

    def _loaded(self, send: Callable[[], R]) -> R:
        """``send()``, again once Redis has our scripts back if it lost them (NOSCRIPT: that
        script did not run; the rest of its pipeline is safe to send twice)."""
        try:
            return send()
        except NoScriptError:
            self.ctx.scripts.load_all()
            return send()

    # --- run -------------------------------------------------------------------------------
    def run(self, begun: Begun) -> Ran:
        """The handler, on the action as claimed (``begun``: status OK). Its lease is renewed
        from here until the outcome is recorded (the caller stops that), not only while the
        handler runs: an outcome sent again through a failover must find its lease held."""
        assert begun.spec is not None and begun.counters is not None
        spec, task = begun.spec, self.task
        view = PendingAction.build(spec, begun.counters, "in_flight", task.edit)
        self.renewer.add(task.session, task.token)
        return _call(view, spec, task, idempotency_key(spec, task.req))

    # --- conclude --------------------------------------------------------------------------
    def conclude(self, begun: Begun, ran: Ran) -> tuple[Conclusion, bool]:
        """Record what the run came to (``conclusion``) with its feed entry; that, and
        whether it was recorded (False: the lease had expired, the outcome refused)."""
        assert begun.spec is not None and begun.counters is not None and begun.lease is not None
        spec, task, scripts = begun.spec, self.task, self.ctx.scripts
        attempts, by = begun.counters.attempts, begun.lease.by
        end = conclusion(ran, spec, task.action, _edit(spec, begun.counters, task.edit),
                         task.reason)
        if end.readd:
            step = scripts.readd(task.session, token=task.token, req=task.req,
                                 last_error=ran.result.text, reply=ran.result.to_json(),
                                 action_id=spec.id, attempt=attempts)
        else:
            step = scripts.finalize(task.session, token=task.token, req=task.req,
                                    reply=ran.result.to_json(), event=end.event,
                                    action_id=spec.id, attempt=attempts, noted=end.noted)
        return end, self._record(step, end.event, spec, by)

    def refused_late(self, begun: Begun, outcome: Event) -> str:
        """The outcome came after its lease had gone (expired, and recovered by recover.lua):
        it changed nothing but the history's late-refused entry."""
        assert begun.spec is not None and begun.counters is not None
        ctx, spec = self.ctx, begun.spec
        retry(lambda: publish(ctx.client, ctx.keys, Event.LATE_REFUSED, spec,
                              outcome=outcome.value), self.budget)
        log.warning("late outcome of %s (attempt %s) refused: its lease had expired",
                    spec.id, begun.counters.attempts)
        return "stale"

    def _record(self, step: Call[Concluded], event: Event | None = None,
                spec: Spec | None = None, by: str = "") -> bool:
        """The outcome (which also ends the lease's index entry), the task's ack and the feed
        entry: one round trip."""
        build = partial(self._queue_outcome, step, event, spec, by)
        return retry(partial(self._loaded, partial(self._send_outcome, build)), self.budget)

    def _queue_outcome(self, step: Call[Concluded], event: Event | None, spec: Spec | None,
                       by: str, pipe: Any) -> Callable[[list[Any]], bool]:
        done = step.on(pipe, by_digest=self.digest)
        if event is not None:  # the session's partition's feed: in the outcome's slot
            publish(pipe, self.ctx.keys, event, spec, by=by)
        if self.settle is not None:
            self.settle(pipe)
        # the outcome is what matters; a feed entry refused (Redis full) is logged, not
        # retried (the ack is too, see taskbroker: a redelivery is fenced by the token)
        return lambda replies: _outcome(replies, done, self.task.session)

    def _send_outcome(self, build: Callable[[Any], Callable[[list[Any]], bool]]) -> bool:
        # an outcome recorded on a master that then failed to replicate it is sent again (to
        # the new master, where the lease still holds); on the same master the second one
        # finds the lease gone, which is no refusal of ours
        try:
            return (acked(self.ctx.client, self.where, build, self.replicas, self.wait_ms,
                          raise_on_error=False, own=True) or self.recorded)
        except NotReplicated as exc:
            self.recorded = self.recorded or bool(exc.result)
            raise


def _edit(spec: Spec, st: ActionState, edit: dict[str, Any] | None) -> dict[str, Any] | None:
    """The patch the handler's payload was made with, for the history: this resolve's, people's
    as approved (the state's), or both composed."""
    if st.patch is None:
        return edit
    if edit is None:
        return st.patch
    return cast(dict[str, Any], patch_between(
        spec.payload, merge_patch(merge_patch(spec.payload, st.patch), edit)))


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
    result included), ``raised`` (pending again) or ``stale`` (it raised Stale), with what it
    raised (for its span)."""

    result: Result
    how: Literal["returned", "raised", "stale"]
    error: BaseException | None = None


class Conclusion(NamedTuple):
    event: Event
    readd: bool  # back where it was (readd.lua), else used up (finalize.lua)
    noted: tuple[str, ...]  # what the history entry of a finalize adds


def conclusion(ran: Ran, spec: Spec, action: ResolveAction,
               edit: dict[str, Any] | None = None, reason: str = "") -> Conclusion:
    """What a handler's run comes to: the one place that decides what happens when a handler
    fails. It raised (a ToolError, any other exception, a time limit): FAILED, and the action
    goes back on its stack's head, or the standing handler stays, with last_error, for the next
    resolve; a directive is used up instead (one shot, whatever the outcome: docs/semantics.md).
    It raised Stale: STALE, used up. It returned, an error result too: APPLIED or DISCARDED,
    used up. (Before any handler runs, a record that does not parse is parked in the dead
    letters, ``_unreadable``; an attempt whose worker is lost is put back, or dead-lettered
    after max_stalls, by recover.lua.)"""
    if ran.how == "stale":
        event = Event.STALE
    elif ran.how == "raised":
        event = Event.FAILED
    else:
        event = Event.APPLIED if action == "apply" else Event.DISCARDED
    # the error text of an error result, and an edit's patch beside the payload it was applied to
    noted: tuple[str, ...] = ("error", ran.result.text) if ran.result.is_error else ()
    # a discard's reason: what a paused agent run gives its model on resume ("Discarded: ...",
    # pending_actions/adapters), the person who discarded it long gone by then
    if event is Event.DISCARDED and reason:
        noted += ("reason", reason)
    if edit is not None:
        noted += ("edit", orjson.dumps(edit).decode(),
                  "payload", orjson.dumps(spec.payload).decode())
    return Conclusion(event, event is Event.FAILED and spec.kind != "directive", noted)


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
        fn = registry.serving(name, spec.tenant)
        if task.edit is not None:
            # the producer checked it already; this guards a request written by hand
            check_payload(view.payload, spec.payload_schema, "edit")
        value = fn(action=view, reason=reason, extra=extra, idempotency_key=key)
        if inspect.isawaitable(value):
            value = aio.run(value)
        return returned(value)
    except Stale as exc:
        return Ran(text_result(texts.stale(str(exc) or "the preview is out of date"), details,
                               is_error=True), "stale", exc)
    except ToolError as exc:
        return Ran(text_result(str(exc), details, is_error=True), "raised", exc)
    except (Exception, Interrupt) as exc:
        message = str(exc) or type(exc).__name__
        log.info("handler %s for %s failed: %s", name, spec.id, message)
        return Ran(text_result(texts.handler_failed(action, message), details, is_error=True),
                   "raised", exc)
