"""``AsyncPendingActions``: the same client for asyncio programs (agent frameworks are async).
It drives the same plans as ``PendingActions`` (``producers/core.py``) over ``redis.asyncio``,
so a resolve waiting on a slow handler awaits its reply without holding up the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.cluster import PipelineCommand
from redis.exceptions import AskError

from pending_actions.broker import tracing
from pending_actions.broker.atomic.replies import RunClaimed
from pending_actions.broker.atomic.scripts import Scripts
from pending_actions.broker.backoff import Backoff
from pending_actions.broker.connection import BLOCK_CHUNK_S, TRANSIENT, async_producer_client
from pending_actions.broker.errors import ConfigError, RedisUnavailable
from pending_actions.broker.failures import REDIS_ERRORS, redis_errors, translate
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import DEFAULT_TENANT, PendingAction, ResolveInput, Result
from pending_actions.broker.policy.rules import Verdict
from pending_actions.broker.settings import Settings
from pending_actions.broker.transactions import transactions_async
from pending_actions.broker.urls import url_options
from pending_actions.producers.client import FIRST_WAIT_S, WAIT_RETRIES
from pending_actions.producers.core import Batch, Chunks, Core, Plan, Run, Wait

T = TypeVar("T")


class AsyncPendingActions:
    """Client of the service for asyncio. One per event loop; every method is awaitable and
    takes the same arguments as ``PendingActions``'s."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        url = self.settings.require_url()
        self.client: redis.asyncio.Redis = async_producer_client(url)
        keys = Keys(self.settings.key_prefix, self.settings.partitions)
        read = url_options(url)
        self.cluster = cluster = read.cluster
        self.tls = read.tls  # named in the errors of a connection that cannot be made
        if cluster and self.settings.replica_wait:
            raise ConfigError("REPLICA_WAIT with AsyncPendingActions on a Redis Cluster is not "
                              "supported yet; use PendingActions there")
        self.core = Core(self.settings, keys, Scripts(self.client, self.settings, keys, False),
                         cluster=cluster)

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> AsyncPendingActions:
        return cls(Settings(redis_url=url, **overrides))

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncPendingActions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the transport ---------------------------------------------------------------------
    async def _run(self, plan: Plan[T]) -> T:
        reply: Any = None
        try:
            while True:
                step = plan.send(reply)
                if isinstance(step, Batch):
                    reply = await self._batch(step)
                elif isinstance(step, Chunks):
                    reply = await self._chunks(step)
                elif isinstance(step, Run):
                    with redis_errors(tls=self.tls):
                        reply = await step.call.run_async()
                else:
                    reply = await self._wait(step)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _batch(self, step: Batch) -> list[Any]:
        with redis_errors(tls=self.tls):
            replicas = self.settings.replica_wait if step.wait_on is not None else 0
            # (WAIT is no command for a MULTI/EXEC: with it the batch is a plain pipeline)
            pipe = self.client.pipeline(transaction=step.transaction and not replicas
                                        and not self.cluster)
            step.queue(pipe)
            if not replicas:
                return await pipe.execute(raise_on_error=step.raise_on_error)
            # one server: WAIT on the pipeline's own connection covers what it just wrote
            pipe.execute_command("WAIT", replicas, self.settings.replica_wait_timeout_ms)
            replies = await pipe.execute(raise_on_error=step.raise_on_error)
            if int(replies[-1]) < replicas:
                raise RedisUnavailable(f"{replies[-1]} of {replicas} replicas confirmed in "
                                       f"{self.settings.replica_wait_timeout_ms} ms")
            return replies[:-1]

    async def _chunks(self, step: Chunks) -> list[list[Any]]:
        """As ``PendingActions._chunks``."""
        if self.cluster or self.settings.replica_wait:
            return [await self._batch(Batch(queue, transaction=not self.cluster,
                                            wait_on=step.wait_on, raise_on_error=False))
                    for queue in step.queues]
        with redis_errors(tls=self.tls):
            return await transactions_async(self.client, step.queues)

    async def _first_wait(self, first: Callable[[Any], object], key: str,
                          seconds: float) -> Any:
        """As ``PendingActions._first_wait``, awaiting instead of blocking."""
        block = ("BLPOP", key, min(seconds, FIRST_WAIT_S))
        if self.cluster:
            replies = await _on_slot_master(self.client, key, first, block)
        else:
            pipe = self.client.pipeline(transaction=False)
            first(pipe)
            pipe.execute_command(*block)
            replies = await pipe.execute(raise_on_error=False)
        if error := next((r for r in replies if isinstance(r, Exception)), None):
            raise error
        return replies[-1]

    async def _wait(self, step: Wait) -> bytes | None:
        """As ``PendingActions._wait``, awaiting instead of blocking."""
        deadline = time.monotonic() + step.seconds
        retry = Backoff(cap=0.5)
        first = step.first
        while (left := deadline - time.monotonic()) > 0:
            try:
                chunk = max(min(left, BLOCK_CHUNK_S), 0.01)
                got: Any
                if first is not None:
                    got = await self._first_wait(first, step.key, chunk)
                    first = None
                else:
                    got = await self.client.blpop([step.key], timeout=chunk)
                if got is not None:
                    return got[1]  # type: ignore[no-any-return]
            except TRANSIENT as exc:
                if retry.failures >= WAIT_RETRIES:
                    raise translate(exc, tls=self.tls) from exc
                await asyncio.sleep(min(retry.next(), max(deadline - time.monotonic(), 0)))
            except REDIS_ERRORS as exc:
                raise translate(exc, tls=self.tls) from exc
        return None

    # --- the methods of PendingActions -----------------------------------------------------
    async def stage_many(self, actions: Iterable[dict[str, Any]]) -> list[str]:
        with tracing.current(tracing.STAGE, {}):
            return await self._run(self.core.stage_many(actions))

    async def stage(self, *, session: str, tool: str, label: str, apply: str,
                    reject: str | None = None, payload: dict[str, Any] | None = None,
                    ttl: float | None = None, fingerprint: str | None = None,
                    schema: dict[str, Any] | None = None, tenant: str = DEFAULT_TENANT) -> str:
        return (await self.stage_many([{
            "session": session, "tool": tool, "label": label, "apply": apply, "reject": reject,
            "payload": payload, "ttl": ttl, "fingerprint": fingerprint, "schema": schema,
            "tenant": tenant}]))[0]

    async def set_directive(self, session: str, *, tool: str, label: str, apply: str,
                            reject: str | None = None) -> str:
        return await self._run(self.core.set_slot(session, "directive", tool, label, apply,
                                                  reject))

    async def set_standing(self, session: str, *, tool: str, label: str, apply: str,
                           reject: str | None = None) -> str:
        return await self._run(self.core.set_slot(session, "standing", tool, label, apply,
                                                  reject))

    async def clear_standing(self, session: str) -> bool:
        return await self._run(self.core.clear_slot(session, "standing"))

    async def clear_directive(self, session: str) -> bool:
        return await self._run(self.core.clear_slot(session, "directive"))

    async def resolve(self, *, session: str, action: str, reason: str,
                      extra: dict[str, Any] | None = None, timeout: float | None = None,
                      edit: dict[str, Any] | None = None,
                      expect_id: str | None = None, by: str | None = None,
                      approver: str | None = None, revision: int | None = None,
                      grant: str | None = None, tenant: str | None = None) -> Result:
        with tracing.current(tracing.RESOLVE, {}):
            return await self._run(self.core.resolve(session, action, reason, extra, timeout,
                                                     edit, expect_id, by, approver, revision,
                                                     grant, tenant))

    async def resolve_tool_call(self, *, session: str, arguments: object,
                                expect_id: str | None = None, timeout: float | None = None,
                                tenant: str | None = None) -> Result:
        given = ResolveInput.of_call(arguments)
        return await self.resolve(session=session, action=given.action, reason=given.reason,
                                  extra=given.extra, expect_id=expect_id, timeout=timeout,
                                  tenant=tenant)

    async def set_policy(self, document: dict[str, Any] | str, tenant: str = DEFAULT_TENANT,
                         by: str | None = None) -> int:
        return await self._run(self.core.set_policy(document, tenant, by))

    async def decide(self, *, session: str, tool: str, apply: str, label: str,
                     payload: dict[str, Any], tenant: str = DEFAULT_TENANT,
                     reject: str | None = None) -> Verdict | None:
        return await self._run(self.core.decide(session=session, tool=tool, apply=apply,
                                                label=label, payload=payload, tenant=tenant,
                                                reject=reject))

    async def claim_run(self, session: str, tenant: str, token: str,
                        fresh: bool) -> RunClaimed:
        return await self._run(self.core.claim_run(session, tenant, token, fresh))

    async def renew_run(self, session: str, token: str) -> bool:
        return await self._run(self.core.renew_run(session, token))

    async def save_run(self, session: str, token: str, *, done: bool, framework: str = "",
                       state: str = "", calls: bytes = b"[]") -> bool:
        return await self._run(self.core.save_run(session, token, done=done,
                                                  framework=framework, state=state,
                                                  calls=calls))

    async def get_policy(self, tenant: str = DEFAULT_TENANT) -> dict[str, Any] | None:
        return await self._run(self.core.get_policy(tenant))

    async def pending(self, session: str, limit: int = 1000) -> list[PendingAction]:
        return await self._run(self.core.pending(session, limit))

    async def stack_depth(self, session: str) -> int:
        return await self._run(self.core.stack_depth(session))

    async def show(self, session: str, action_id: str) -> PendingAction | None:
        return await self._run(self.core.show(session, action_id))

    async def next_tool_choice(self, session: str) -> dict[str, Any] | None:
        return await self._run(self.core.next_tool_choice(session))

    async def history(self, session: str, count: int = 100) -> list[dict[str, Any]]:
        return await self._run(self.core.history(session, count))

    async def dead_letters(self, session: str) -> list[dict[str, Any]]:
        return await self._run(self.core.dead_letters(session))

    async def admits(self, handler: str, tenant: str) -> bool:
        return await self._run(self.core.admits(handler, tenant))

    async def tenant_of(self, session: str) -> str | None:
        return await self._run(self.core.tenant_of(session))

    async def stats(self) -> dict[str, Any]:
        return await self._run(self.core.stats())


class _Queue:
    """The commands a plan's step queues (it calls ``execute_command`` only), kept in order."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> _Queue:
        self.commands.append(args)
        return self


async def _on_slot_master(cluster: Any, key: str, first: Callable[[Any], object],
                          *last: tuple[Any, ...]) -> list[Any]:
    """On a cluster: the commands ``first`` queues, then ``last``, every one in ``key``'s slot,
    sent to that slot's master in one round trip. redis-py's asyncio cluster pipeline cannot
    block, which would make a resolve's BLPOP a round trip of its own. Returns the replies,
    each error in its place; a move (MOVED or ASK: those commands did not run) or a dropped
    connection reads the slot table again and raises, for the caller's retry to send them
    again to the slot's master then."""
    queued = _Queue()
    first(queued)
    for args in last:
        queued.execute_command(*args)
    commands = [PipelineCommand(i, *args) for i, args in enumerate(queued.commands)]
    try:
        await cluster.initialize()  # a no-op but for a client's first call
        await cluster.get_node_from_key(key).execute_pipeline(commands)
    except TRANSIENT:
        await _relearn(cluster)
        raise
    replies = [c.result for c in commands]
    if (moved := next((r for r in replies if isinstance(r, AskError)), None)) is not None:
        await _relearn(cluster)
        raise redis.ConnectionError(f"slot moved: {moved}") from moved
    if (lost := next((r for r in replies if isinstance(r, TRANSIENT)), None)) is not None:
        await _relearn(cluster)
        raise lost
    return replies


async def _relearn(cluster: Any) -> None:
    """The slot table read again (as ``roundtrips.relearn`` does for the blocking client); one
    that cannot be read now is left for the next try."""
    with contextlib.suppress(*REDIS_ERRORS):
        await cluster.nodes_manager.initialize()
