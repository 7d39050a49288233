"""The resolve worker's second loop: return the attempts whose lease expired, found through
the lease index; end the actions whose ttl passed, found through the expiry index; and sweep
every session once after Redis comes back without its data tail."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any

import redis
from pydantic import ValidationError

from pending_actions.broker import texts
from pending_actions.broker.context import Context
from pending_actions.broker.events import Event, WorkerEvent
from pending_actions.broker.failures import poison_of
from pending_actions.broker.feed import publish
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import Lease, Spec
from pending_actions.broker.policy import check_policy
from pending_actions.broker.replies import ExpireOutcome, Recovered, RecoverOutcome
from pending_actions.broker.results import base_details, text_result
from pending_actions.workers.poison import park_poison
from pending_actions.workers.retention import Retirement

log = logging.getLogger("pending_actions.resolver")

SWEEP_LOCK_S = 600
SWEPT_SENTINEL = "~swept:"  # + run_id: the index's own mark of the sweep it had


_FEED = {RecoverOutcome.RETURNED: Event.RECOVERED,
         RecoverOutcome.DEAD_LETTERED: Event.DEAD_LETTERED}

class Recovery:
    def __init__(self, ctx: Context, name: str, stop: threading.Event) -> None:
        self.ctx = ctx
        self.name = name
        self.stop = stop
        every = ctx.settings.sweep_check_s
        self.next_check = time.monotonic() + random.uniform(0, every)  # spread out
        self.retire = Retirement(ctx)

    def step(self) -> None:
        """One round of the recovery loop (run by ``broker.loops.Loop``)."""
        self.recover_due()
        self.expire_due()
        if time.monotonic() >= self.next_check:
            self.next_check = time.monotonic() + self.ctx.settings.sweep_check_s
            info: Any = self.ctx.client.info("everything")
            check_policy(info)
            self.sweep_if_restarted(str(info["run_id"]))
        self.retire.step()

    def _now_ms(self) -> int:
        sec, usec = self.ctx.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def recover_due(self) -> int:
        """Look at the leases whose index entry is due: recover the expired ones, move the
        entry of a live one to its real deadline, drop the entry of one that is gone."""
        ctx, now = self.ctx, self._now_ms()
        due: Any = ctx.client.zrangebyscore(ctx.keys.leases, "-inf", now, start=0, num=100)
        if not due:
            return 0
        pairs = [Keys.parse_lease_member(m) for m in due]
        pipe = ctx.client.pipeline(transaction=False)
        for session, token in pairs:
            pipe.hget(ctx.keys.inflight(session), token)
        recovered = 0
        fix = ctx.client.pipeline(transaction=False)
        for member, (session, token), raw in zip(due, pairs, pipe.execute(), strict=True):
            lease = self._lease(session, token, raw)
            if lease is not None and lease.deadline <= now:
                try:
                    got = ctx.scripts.recover(
                        session, token, lease.req, self._recovery_replies(session, lease),
                        (texts.worker_lost_error(lease.attempt),
                         texts.never_started_error(lease.attempt))).run()
                except redis.ResponseError as exc:
                    found = poison_of(exc)
                    if found is None:
                        raise
                    park_poison(ctx, session, found)  # the next round recovers the lease
                    continue
                if got.outcome in _FEED:  # a stall, or the last one: on the feed
                    publish(fix, ctx.keys, _FEED[got.outcome], session=session, id=lease.id,
                            attempt=lease.attempt, by=lease.by)
                if got.outcome not in (RecoverOutcome.GONE, RecoverOutcome.LIVE):
                    recovered += 1
                    log.warning("lease of %s attempt %d expired: %s", lease.id, lease.attempt,
                                got.outcome.name.lower().replace("_", " "))
            elif lease is not None:
                got = Recovered(RecoverOutcome.LIVE, lease.deadline)
            else:
                got = Recovered(RecoverOutcome.GONE, 0)
            if got.outcome is RecoverOutcome.LIVE:  # renewed since the entry was written
                fix.zadd(ctx.keys.leases, {member: got.deadline}, xx=True)
            else:
                fix.zrem(ctx.keys.leases, member)
        fix.execute()
        return recovered

    def expire_due(self) -> int:
        """End the actions whose ttl has passed (``expire.lua``): no handler runs and no worker
        needs to be free, only this loop. Readers already treat them as gone; this writes the
        history entry and frees their keys. One taken before its ttl passed is looked at again
        a lease later."""
        ctx, now = self.ctx, self._now_ms()
        due: Any = ctx.client.zrangebyscore(ctx.keys.expiries, "-inf", now, start=0, num=100)
        if not due:
            return 0
        pairs = [Keys.parse_lease_member(m) for m in due]
        pipe = ctx.client.pipeline(transaction=False)
        calls = [ctx.scripts.expire(session, action_id).on(pipe) for session, action_id in pairs]
        replies = pipe.execute()
        fix = ctx.client.pipeline(transaction=False)
        ended = 0
        for member, queued in zip(due, calls, strict=True):
            got = queued.get(replies)
            if got.outcome is ExpireOutcome.IN_FLIGHT:
                fix.zadd(ctx.keys.expiries, {member: now + ctx.settings.lease_ms}, xx=True)
            elif got.outcome is ExpireOutcome.LATER:  # staged on a client clock that runs fast
                fix.zadd(ctx.keys.expiries, {member: got.at}, xx=True)
            else:
                if got.outcome is ExpireOutcome.ENDED:
                    ended += 1
                    session, action_id = Keys.parse_lease_member(member)
                    publish(fix, ctx.keys, Event.EXPIRED, session=session, id=action_id)
                fix.zrem(ctx.keys.expiries, member)
        fix.execute()
        return ended

    def sweep_if_restarted(self, run_id: str | None = None) -> int:
        """Index entries are written before their leases, so only a Redis that lost data (a
        crash under appendfsync everysec, a failover, the index deleted by hand) can hold a
        lease without one. The index carries a sentinel member naming the server run it was
        swept for (score +inf: never due), so a new run_id and a lost index both show: the
        first resolve worker to notice sweeps every session once, under a lock."""
        ctx = self.ctx
        run_id = run_id or str(ctx.client.info("server")["run_id"])
        sentinel = SWEPT_SENTINEL + run_id
        if ctx.client.zscore(ctx.keys.leases, sentinel) is not None:
            return 0
        if not ctx.client.set(ctx.keys.sweep_lock, self.name, nx=True, ex=SWEEP_LOCK_S):
            return 0
        try:
            count = self.sweep()
            stale: Any = ctx.client.zrangebyscore(ctx.keys.leases, "+inf", "+inf")
            pipe = ctx.client.pipeline(transaction=False)
            if stale:
                pipe.zrem(ctx.keys.leases, *stale)
            pipe.zadd(ctx.keys.leases, {sentinel: "+inf"})
            pipe.set(ctx.keys.swept, run_id)
            pipe.xadd(ctx.keys.workers, {"role": "resolver", "event": WorkerEvent.SWEPT,
                                         "run_id": run_id, "indexed": count, "name": self.name,
                                         "pid": os.getpid()},
                      maxlen=1000, approximate=True)
            pipe.execute()
        finally:
            ctx.client.delete(ctx.keys.sweep_lock)
        if count:
            log.warning("sweep of Redis run %s indexed %d leases it had lost", run_id, count)
        return count

    def sweep(self) -> int:
        """Give every lease of every session an index entry if it has none, and every ttl
        its entry in the expiry index; recover_due and expire_due then treat them as usual.
        Sessions are found by their in-flight and expiry keys (SCAN, 500 keys a round trip),
        not the sessions set, which may have been lost too."""
        ctx, count = self.ctx, 0
        sessions: set[str] = set()
        for pattern in (ctx.keys.inflight("*"), ctx.keys.expiry("*")):
            head, tail = pattern.split("*")
            for key in ctx.client.scan_iter(match=pattern, count=500):
                text = key.decode() if isinstance(key, bytes) else str(key)
                sessions.add(text[len(head):len(text) - len(tail)])
        ordered = sorted(sessions)
        for i in range(0, len(ordered), 500):
            count += self._index(ordered[i:i + 500])
        return count

    def _index(self, sessions: list[str]) -> int:
        ctx = self.ctx
        pipe = ctx.client.pipeline(transaction=False)
        for session in sessions:
            pipe.hgetall(ctx.keys.inflight(session))
            pipe.zrange(ctx.keys.expiry(session), 0, -1, withscores=True)
        add = ctx.client.pipeline(transaction=False)
        ttls = ctx.client.pipeline(transaction=False)  # not counted: they are no leases
        got = pipe.execute()
        for session, leases, expiring in zip(sessions, got[::2], got[1::2], strict=True):
            for token, raw in leases.items():
                lease = self._lease(session, token.decode(), raw)
                if lease is not None:
                    add.zadd(ctx.keys.leases,
                             {ctx.keys.lease_member(session, token.decode()): lease.deadline},
                             nx=True)
            for action_id, at in expiring:
                ttls.zadd(ctx.keys.expiries,
                          {ctx.keys.lease_member(session, action_id.decode()): at}, nx=True)
        if len(ttls):
            ttls.execute()
        return sum(add.execute()) if len(add) else 0

    def _lease(self, session: str, token: str, raw: bytes | None) -> Lease | None:
        """The lease, or None when there is none; one that does not parse is parked (the
        action it held goes back where it was)."""
        if raw is None:
            return None
        try:
            return Lease.model_validate_json(raw)
        except ValidationError as exc:
            reason = f"lease does not parse: {exc.errors()[0]['msg']}"
            self.ctx.scripts.park(session, "lease", token, raw, reason).run()
            log.warning("session %s: unreadable lease %s parked (%s)", session, token, reason)
            return None

    def _recovery_replies(self, session: str, lease: Lease) -> tuple[bytes, bytes, bytes]:
        raw: Any = self.ctx.client.hget(self.ctx.keys.actions(session), lease.id)
        try:
            spec = Spec.model_validate_json(raw) if raw else None
        except ValidationError:
            spec = None  # parked by the worker that next begins it
        details = base_details(lease.action, lease.reason, lease.extra_value, spec)

        def reply(text: str) -> bytes:
            return text_result(text, details, is_error=True).to_json()

        return (reply(texts.worker_lost(lease.action, lease.attempt, lease.id)),
                reply(texts.dead_lettered(lease.action, lease.id, self.ctx.settings.max_stalls)),
                reply(texts.never_started(lease.action, lease.attempt, lease.id)))
