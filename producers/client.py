"""``PendingActions``: what an agent runtime imports to stage actions and resolve them. The
logic is in ``producers/core.py``; this class sends its plans with redis-py's blocking client
(``producers/aio.py`` does the same with ``redis.asyncio``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis

from pending_actions.broker import roundtrips, tracing
from pending_actions.broker.backoff import FAILOVER_WAIT_S, Backoff, retry
from pending_actions.broker.connection import BLOCK_CHUNK_S, TRANSIENT, is_cluster
from pending_actions.broker.context import Context
from pending_actions.broker.failures import REDIS_ERRORS, redis_errors, translate
from pending_actions.broker.models import DEFAULT_TENANT, PendingAction, ResolveInput, Result
from pending_actions.broker.policy.rules import Verdict
from pending_actions.broker.roundtrips import acked
from pending_actions.broker.routing import LiveView
from pending_actions.broker.settings import Settings
from pending_actions.broker.transactions import transactions
from pending_actions.broker.urls import url_options
from pending_actions.producers.core import Batch, Chunks, Core, Plan, Run, Wait

T = TypeVar("T")
WAIT_RETRIES = 3  # dropped connections in a row a reply wait rides out
# the first reply wait rides in the request's round trip, so a refused request (Redis full) is
# only known when that wait ends: it is kept short
FIRST_WAIT_S = 0.5


def _queued(step: Batch) -> Callable[[Any], Callable[[list[Any]], list[Any]]]:
    def build(pipe: Any) -> Callable[[list[Any]], list[Any]]:
        step.queue(pipe)
        return lambda replies: replies

    return build


class PendingActions:
    """Client of the service. Thread-safe; one per process is enough."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.ctx = Context.create(self.settings)
        self.tls = url_options(self.settings.require_url()).tls  # named in connection errors
        self.core = Core(self.settings, self.ctx.keys, self.ctx.scripts,
                         cluster=is_cluster(self.ctx.client))
        self.live = LiveView(self.ctx.client, self.ctx.keys)  # for operators' views

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> PendingActions:
        return cls(Settings(redis_url=url, **overrides))

    @property
    def client(self) -> redis.Redis:
        return self.ctx.client

    def close(self) -> None:
        self.ctx.client.close()

    # --- the transport ---------------------------------------------------------------------
    def _run(self, plan: Plan[T]) -> T:
        reply: Any = None
        try:
            while True:
                step = plan.send(reply)
                if isinstance(step, Batch):
                    reply = self._batch(step)
                elif isinstance(step, Chunks):
                    reply = self._chunks(step)
                elif isinstance(step, Run):
                    with redis_errors(tls=self.tls):
                        reply = step.call.run()
                else:
                    reply = self._wait(step)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _batch(self, step: Batch) -> list[Any]:
        with redis_errors(tls=self.tls):
            if step.wait_on is not None and self.settings.replica_wait:
                def send() -> list[Any]:
                    return acked(self.client, step.wait_on or "", _queued(step),
                                 self.settings.replica_wait,
                                 self.settings.replica_wait_timeout_ms, step.raise_on_error)

                # sent again (a stage.lua call is a no-op where it went through) until a replica
                # has it, through a failover of up to FAILOVER_WAIT_S
                return retry(send, FAILOVER_WAIT_S)
            # an older redis-py's cluster pipeline takes no MULTI/EXEC: a plain pipeline there
            pipe = self.client.pipeline(transaction=step.transaction
                                        and not is_cluster(self.client))
            step.queue(pipe)
            return pipe.execute(raise_on_error=step.raise_on_error)

    def _chunks(self, step: Chunks) -> list[list[Any]]:
        cluster = is_cluster(self.client)
        if cluster or self.settings.replica_wait:
            return [self._batch(Batch(queue, transaction=not cluster, wait_on=step.wait_on,
                                      raise_on_error=False)) for queue in step.queues]
        with redis_errors(tls=self.tls):
            return transactions(self.client, step.queues)

    def _first_wait(self, first: Callable[[Any], object], key: str, seconds: float) -> Any:
        """The commands ``first`` queues (the request, in ``key``'s slot) and, in the same
        round trip, a BLPOP of ``key`` for up to FIRST_WAIT_S. Raises the first error of the
        request's commands."""
        # a roundtrips.Batch (on a cluster, on the slot's master): redis-py's pipeline costs an
        # idle caller more CPU than the round trip (BLPOP's reply is the same either way: key
        # and value, or None), and its cluster pipeline can neither block nor send an EVALSHA
        # without first asking a server for its keys
        pipe = roundtrips.pipeline(self.client, key=key)
        first(pipe)
        pipe.execute_command("BLPOP", key, min(seconds, FIRST_WAIT_S))
        replies = pipe.execute(raise_on_error=False)
        if error := next((r for r in replies if isinstance(r, Exception)), None):
            raise error
        return replies[-1]

    def _wait(self, step: Wait) -> bytes | None:
        """BLPOP until the deadline, the first one in the same round trip as ``step.first``.
        A dropped connection is retried with the time that is left (the request is sent
        again if it may not have arrived: a request seen twice is served once); Redis staying
        away raises RedisUnavailable."""
        deadline = time.monotonic() + step.seconds
        retry = Backoff(cap=0.5)
        first = step.first
        while (left := deadline - time.monotonic()) > 0:
            try:
                chunk = max(min(left, BLOCK_CHUNK_S), 0.01)
                got: Any
                if first is not None:
                    got = self._first_wait(first, step.key, chunk)
                    first = None
                else:
                    got = self.client.blpop([step.key], timeout=chunk)
                if got is not None:
                    return got[1]  # type: ignore[no-any-return]
            except TRANSIENT as exc:
                if retry.failures >= WAIT_RETRIES:
                    raise translate(exc, tls=self.tls) from exc
                time.sleep(min(retry.next(), max(deadline - time.monotonic(), 0)))
            except REDIS_ERRORS as exc:
                raise translate(exc, tls=self.tls) from exc
        return None

    # --- staging ---------------------------------------------------------------------------
    def stage_many(self, actions: Iterable[dict[str, Any]]) -> list[str]:
        """Stage many actions in a few round trips: each dict has the keyword arguments of
        ``stage``. Every action is checked before anything is staged; in each session they go
        on the stack in the order given (so the last one given is the head)."""
        with tracing.current(tracing.STAGE, {}):
            return self._run(self.core.stage_many(actions))

    def stage(self, *, session: str, tool: str, label: str, apply: str,
              reject: str | None = None, payload: dict[str, Any] | None = None,
              ttl: float | None = None, fingerprint: str | None = None,
              schema: dict[str, Any] | None = None, tenant: str = DEFAULT_TENANT) -> str:
        """Stage a pending action on top of the session's stack. Returns its id.

        ``ttl``: seconds after which it ends as ``expired``. ``fingerprint``: what the preview
        was computed from, for the handler to compare (``action.fingerprint``). ``schema``: the
        JSON Schema of the payload, which the payload and every ``resolve(edit=)`` must meet.
        A session belongs to the tenant of its first stage; staging for another raises
        Forbidden."""
        return self.stage_many([{"session": session, "tool": tool, "label": label,
                                 "apply": apply, "reject": reject, "payload": payload,
                                 "ttl": ttl, "fingerprint": fingerprint, "schema": schema,
                                 "tenant": tenant}])[0]

    def set_directive(self, session: str, *, tool: str, label: str, apply: str,
                      reject: str | None = None) -> str:
        """Set the session's one-shot directive; it takes precedence over the stack and is
        consumed by the first resolve that goes through it, whatever that resolve's outcome."""
        return self._run(self.core.set_slot(session, "directive", tool, label, apply, reject))

    def set_standing(self, session: str, *, tool: str, label: str, apply: str,
                     reject: str | None = None) -> str:
        """Set the session's standing handler: the fallback when nothing else is pending."""
        return self._run(self.core.set_slot(session, "standing", tool, label, apply, reject))

    def clear_standing(self, session: str) -> bool:
        return self._run(self.core.clear_slot(session, "standing"))

    def clear_directive(self, session: str) -> bool:
        return self._run(self.core.clear_slot(session, "directive"))

    # --- resolving -------------------------------------------------------------------------
    def resolve(self, *, session: str, action: str, reason: str,
                extra: dict[str, Any] | None = None, timeout: float | None = None,
                edit: dict[str, Any] | None = None, expect_id: str | None = None,
                by: str | None = None, approver: str | None = None,
                revision: int | None = None, grant: str | None = None,
                tenant: str | None = None) -> Result:
        """Apply or discard the session's current target and wait for the outcome.

        ``edit``: a JSON Merge Patch for the payload, applied before the handler runs (apply
        only; checked against the action's schema). ``expect_id``: go through only if that id
        is the target, else an error naming ``expect_id`` and nothing changes. ``by``: who
        resolves, recorded in the session's history. ``approver``: a person's resolve (never
        the model's): it counts as that person's approval of an action its policy asks people
        for (names are compared NFKC-normalized, trimmed and case-folded: ``Alice`` is
        ``alice``). ``grant``: the serve token the approval came through (``serve`` sets it):
        once that token is revoked, the approval no longer counts. ``revision``: go through
        only if the target's payload is still at that revision (the number of people's
        edits). ``tenant``: whose resolve this is: in a session of another tenant it finds
        nothing (checked in the step that takes), as in one that does not exist."""
        with tracing.current(tracing.RESOLVE, {}):
            return self._run(self.core.resolve(session, action, reason, extra, timeout, edit,
                                               expect_id, by, approver, revision, grant, tenant))

    def resolve_tool_call(self, *, session: str, arguments: object,
                          expect_id: str | None = None, timeout: float | None = None,
                          tenant: str | None = None) -> Result:
        """The model's call of the ``resolve`` tool, its arguments as the model sent them: only
        ``action``, ``reason`` and ``extra`` (any other key, ``approver`` among them, is an
        ``InvalidInput`` naming it, and nothing is sent). What an agent runtime calls for the
        model: it can never count as a person's approval. ``expect_id``: the runtime's own (the
        id the reminder was about)."""
        given = ResolveInput.of_call(arguments)
        return self.resolve(session=session, action=given.action, reason=given.reason,
                            extra=given.extra, expect_id=expect_id, timeout=timeout,
                            tenant=tenant)

    # --- policies --------------------------------------------------------------------------
    def set_policy(self, document: dict[str, Any] | str, tenant: str = DEFAULT_TENANT,
                   by: str | None = None) -> int:
        """Set ``tenant``'s policy (a dict, or a JSON/YAML text; docs/policies.md): checked,
        kept as a new version beside the earlier ones, in force for every stage from then on.
        Returns the version."""
        return self._run(self.core.set_policy(document, tenant, by))

    def decide(self, *, session: str, tool: str, apply: str, label: str,
               payload: dict[str, Any], tenant: str = DEFAULT_TENANT,
               reject: str | None = None) -> Verdict | None:
        """What the tenant's policy in force decides for such an action (None: it has none),
        without staging it."""
        return self._run(self.core.decide(session=session, tool=tool, apply=apply,
                                          label=label, payload=payload, tenant=tenant,
                                          reject=reject))

    def get_policy(self, tenant: str = DEFAULT_TENANT) -> dict[str, Any] | None:
        """The tenant's current policy: {version, set_at, by, document}; None without one."""
        return self._run(self.core.get_policy(tenant))

    # --- reading ---------------------------------------------------------------------------
    def pending(self, session: str, limit: int = 1000) -> list[PendingAction]:
        """In-flight actions first, then the stack, head first."""
        return self._run(self.core.pending(session, limit))

    def stack_depth(self, session: str) -> int:
        """How many actions are stacked in the session (not in flight), none of them read."""
        return self._run(self.core.stack_depth(session))

    def show(self, session: str, action_id: str) -> PendingAction | None:
        """One staged action, directive or standing handler by id; None if it is gone."""
        return self._run(self.core.show(session, action_id))

    def next_tool_choice(self, session: str) -> dict[str, Any] | None:
        """The directive if set; else a soft requirement to call resolve; else None."""
        return self._run(self.core.next_tool_choice(session))

    def history(self, session: str, count: int = 100) -> list[dict[str, Any]]:
        return self._run(self.core.history(session, count))

    def dead_letters(self, session: str) -> list[dict[str, Any]]:
        return self._run(self.core.dead_letters(session))

    def admits(self, handler: str, tenant: str) -> bool:
        """Whether the live workers serve ``handler`` to ``tenant`` (``@handler(name,
        tenants=...)``, ``--mcp-upstream-tenants``)."""
        return self._run(self.core.admits(handler, tenant))

    def tenant_of(self, session: str) -> str | None:
        """The tenant the session belongs to (its first stage's); None while it has none."""
        return self._run(self.core.tenant_of(session))

    def stats(self) -> dict[str, Any]:
        return self._run(self.core.stats())
