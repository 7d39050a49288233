"""The resolve worker's second loop: return the attempts whose lease expired, found through
the partitions' lease indexes, and end the actions whose ttl passed, found through the
partitions' expiry indexes.

The scripts that make, renew and end a lease write its index entry in the same atomic step,
so a lease never exists without its entry, even on a Redis that lost the tail of its data or
on a replica promoted by a failover (a script replicates as one transaction): no sweep of the
sessions is ever needed."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pending_actions.broker import texts
from pending_actions.broker.backoff import Backoff
from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.context import Context
from pending_actions.broker.events import Event
from pending_actions.broker.feed import publish
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import Lease, Spec
from pending_actions.broker.replies import ExpireOutcome, RecoverOutcome
from pending_actions.broker.results import base_details, text_result

log = logging.getLogger("pending_actions.resolver")

DUE_BATCH = 100  # entries looked at per partition per round
_FEED = {RecoverOutcome.RETURNED: Event.RECOVERED,
         RecoverOutcome.DEAD_LETTERED: Event.DEAD_LETTERED}


class Recovery:
    def __init__(self, ctx: Context, name: str, stop: threading.Event) -> None:
        self.ctx = ctx
        self.name = name
        self.stop = stop
        self.recovered = 0  # by the last read, for tests and logs

    def run(self) -> None:
        """Every ``recovery_interval_ms``, but reading the indexes only when a lease may be due:
        at the earliest deadline the last read saw, and at the latest a shortest lease after
        it (a lease made since then cannot end sooner). An idle deployment reads them once a
        LEASE_MS, not once an interval."""
        retry = Backoff()
        s = self.ctx.settings
        interval, shortest = s.recovery_interval_ms / 1000, min(s.lease_ms,
                                                                 s.dispatch_timeout_ms) / 1000
        next_read = 0.0
        while not self.stop.wait(interval):
            try:
                # an action may be staged with any ttl at any time: its index is read each round
                self.expire_due()
                if time.monotonic() >= next_read:
                    earliest = self.recover_due()
                    # the server's clock said when; the wait is on ours, a little early is fine
                    wait = shortest if earliest is None else min(shortest, earliest / 1000)
                    next_read = time.monotonic() + wait
                retry.reset()
            except TRANSIENT as exc:
                retry.wait(self.stop, exc, "Redis unavailable")

    def _now_ms(self) -> int:
        sec, usec = self.ctx.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def recover_due(self) -> float | None:
        """Look at the leases whose index entry is due (one pipelined read of the first
        entries of every partition's index): recover.lua returns the expired ones, and moves
        the entry of one renewed meanwhile to its deadline or drops the entry of one that is
        gone. Returns in how many ms the earliest entry not yet due will be (0 when a
        partition had more due than one read takes), None when no index has any."""
        ctx, now = self.ctx, self._now_ms()
        pipe = ctx.client.pipeline(transaction=False)
        for p in range(ctx.keys.partitions):
            pipe.zrange(ctx.keys.leases(p), 0, DUE_BATCH - 1, withscores=True)
        due, later = [], []
        for entries in pipe.execute():
            due += [Keys.parse_lease_member(m) for m, score in entries if score <= now]
            later += [score - now for _m, score in entries if score > now]
            if len(entries) == DUE_BATCH and entries[-1][1] <= now:
                later.append(0)  # more due than one read: look again at once
        self.recovered = self._recover(due, now) if due else 0
        return min(later) if later else None

    def _recover(self, due: list[tuple[str, str]], now: int) -> int:
        ctx = self.ctx
        pipe = ctx.client.pipeline(transaction=False)
        for session, token in due:
            pipe.hget(ctx.keys.inflight(session), token)
        fix = ctx.client.pipeline(transaction=False)
        queued = []
        for (session, token), raw in zip(due, pipe.execute(), strict=True):
            lease = Lease.model_validate_json(raw) if raw else None
            if lease is not None and lease.deadline <= now:
                replies = self._recovery_replies(session, lease)
                errors = (texts.worker_lost_error(lease.attempt),
                          texts.never_started_error(lease.attempt))
            else:  # live or gone: recover.lua only puts the entry right
                replies, errors = (b"", b"", b""), ("", "")
            req = lease.req if lease is not None else "-"
            queued.append((lease, ctx.scripts.recover(session, token, req, replies,
                                                      errors).on(fix)))
        replies_all = fix.execute()
        recovered = 0
        feed = ctx.client.pipeline(transaction=False)
        for (session, _t), (lease, got_q) in zip(due, queued, strict=True):
            got = got_q.get(replies_all)
            if lease is None or got.outcome in (RecoverOutcome.GONE, RecoverOutcome.LIVE):
                continue
            recovered += 1
            log.warning("lease of %s attempt %d expired: %s", lease.id, lease.attempt,
                        got.outcome.name.lower().replace("_", " "))
            if got.outcome in _FEED:  # a stall, or the last one: on the feed
                publish(feed, ctx.keys, _FEED[got.outcome], session=session, id=lease.id,
                        attempt=lease.attempt, by=lease.by)
        if len(feed):
            feed.execute()
        return recovered

    def expire_due(self) -> int:
        """End the actions whose ttl has passed (``expire.lua``): no handler runs and no worker
        needs to be free, only this loop. Readers already treat them as gone; this writes the
        history entry and frees their keys. One taken before its ttl passed is looked at again
        a lease later."""
        ctx, now = self.ctx, self._now_ms()
        pipe = ctx.client.pipeline(transaction=False)
        for p in range(ctx.keys.partitions):
            pipe.zrangebyscore(ctx.keys.expiries(p), "-inf", now, start=0, num=DUE_BATCH)
        due = [m for members in pipe.execute() for m in members]
        if not due:
            return 0
        pairs = [Keys.parse_lease_member(m) for m in due]
        pipe = ctx.client.pipeline(transaction=False)
        calls = [ctx.scripts.expire(session, action_id).on(pipe) for session, action_id in pairs]
        replies = pipe.execute()
        fix = ctx.client.pipeline(transaction=False)
        ended = 0
        for member, (session, action_id), queued in zip(due, pairs, calls, strict=True):
            index = ctx.keys.expiries(ctx.keys.partition(session))
            got = queued.get(replies)
            if got.outcome is ExpireOutcome.IN_FLIGHT:
                fix.zadd(index, {member: now + ctx.settings.lease_ms}, xx=True)
            elif got.outcome is ExpireOutcome.LATER:
                fix.zadd(index, {member: got.at}, xx=True)
            else:
                if got.outcome is ExpireOutcome.ENDED:
                    ended += 1
                    publish(fix, ctx.keys, Event.EXPIRED, session=session, id=action_id)
                fix.zrem(index, member)
        fix.execute()
        return ended

    def _recovery_replies(self, session: str, lease: Lease) -> tuple[bytes, bytes, bytes]:
        raw: Any = self.ctx.client.hget(self.ctx.keys.actions(session), lease.id)
        spec = Spec.model_validate_json(raw) if raw else None
        details = base_details(lease.action, lease.reason, lease.extra_value, spec)

        def reply(text: str) -> bytes:
            return text_result(text, details, is_error=True).to_json()

        return (reply(texts.worker_lost(lease.action, lease.attempt, lease.id)),
                reply(texts.dead_lettered(lease.action, lease.id, self.ctx.settings.max_stalls)),
                reply(texts.never_started(lease.action, lease.attempt, lease.id)))
