"""The resolve worker's second loop: return the attempts whose lease expired, found through
the partitions' lease indexes, and end the actions whose ttl passed, found through the
partitions' expiry indexes.

The scripts that make, renew and end a lease write its index entry in the same atomic step,
so a lease never exists without its entry, even on a Redis that lost the tail of its data or
on a replica promoted by a failover (a script replicates as one transaction). An entry deleted
by hand is put back by the slow sweep of in-flight state (``workers/sweep.py``), a page each
round here."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from pydantic import ValidationError

from pending_actions.broker import texts, tracing
from pending_actions.broker.atomic.replies import ExpireOutcome, RecoverOutcome
from pending_actions.broker.connection import is_cluster, server_info
from pending_actions.broker.context import Context
from pending_actions.broker.errors import RedisFull
from pending_actions.broker.events import Event
from pending_actions.broker.failures import poison_of, translate
from pending_actions.broker.feed import publish
from pending_actions.broker.keys import NOTHING_DUE, Keys
from pending_actions.broker.models import Lease, Spec
from pending_actions.broker.preflight import check_policy
from pending_actions.broker.results import base_details, text_result
from pending_actions.workers.poison import park_poison
from pending_actions.workers.policy_markers import raise_markers
from pending_actions.workers.retention import Retirement
from pending_actions.workers.sweep import Sweep

log = logging.getLogger("pending_actions.resolver")

DUE_BATCH = 100  # entries looked at per partition per round
# every expiry index is read at least this often, whatever its mark says: an older producer
# stages a ttl without lowering the mark, and its action still ends within this
FULL_SWEEP_S = 60.0
_FEED = {RecoverOutcome.RETURNED: Event.RECOVERED,
         RecoverOutcome.DEAD_LETTERED: Event.DEAD_LETTERED}


class Recovery:
    def __init__(self, ctx: Context, name: str, stop: threading.Event) -> None:
        self.ctx = ctx
        self.name = name
        self.stop = stop
        self.recovered = 0  # by the last read, for tests and logs
        s = ctx.settings
        self.shortest = min(s.lease_ms, s.dispatch_timeout_ms) / 1000
        self.next_read = 0.0
        every = s.policy_check_s
        self.next_check = time.monotonic() + random.uniform(0, every)  # spread out
        self.retire = Retirement(ctx)
        self.sweep = Sweep(ctx)
        self.next_markers = 0.0
        # expiries members found in flight past their ttl -> (partition, when to look again,
        # ms). Their entry keeps its score, the expiry that every reader checks, so the due
        # range goes on listing them: each is asked about again a lease later, not each round
        self.in_flight: dict[bytes, tuple[int, int]] = {}
        self.next_full_sweep = 0.0

    def step(self) -> None:
        """One round of the recovery loop (run by ``broker.loops.Loop`` every
        ``recovery_interval_ms``), reading the lease indexes only when a lease may be due: at
        the earliest deadline the last read saw, and at the latest a shortest lease after it (a
        lease made since then cannot end sooner). An idle deployment reads them once a
        LEASE_MS, not once an interval."""
        # an action may be staged with any ttl at any time: its index is read each round
        self.expire_due()
        if time.monotonic() >= self.next_read:
            earliest = self.recover_due()
            # the server's clock said when; the wait is on ours, a little early is fine
            wait = self.shortest if earliest is None else min(self.shortest, earliest / 1000)
            self.next_read = time.monotonic() + wait
        if time.monotonic() >= self.next_check:
            self.next_check = time.monotonic() + self.ctx.settings.policy_check_s
            check_policy(server_info(self.ctx.client, "memory"))
        for chore in (self.retire.step, self.sweep.step):
            try:
                chore()
            except redis.RedisError as exc:
                # housekeeping waits for memory (its round's lock is a write Redis refuses
                # then); recovery itself goes on, and the loop with it, beating
                if not isinstance(translate(exc), RedisFull):
                    raise
        if time.monotonic() >= self.next_markers:
            # a policy set that stopped before raising every partition's marker is finished
            # here (each resolve worker, every housekeeping round: a read of the index and of
            # the markers; mark_policy.lua never lowers one)
            self.next_markers = time.monotonic() + self.ctx.settings.housekeeping_s
            try:
                raise_markers(self.ctx)
            except redis.RedisError as exc:
                if not isinstance(translate(exc), RedisFull):  # waits for memory, as above
                    raise

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
            lease = self._lease(session, token, raw)
            if lease is not None and lease.deadline <= now:
                returned, dead, unstarted = self._recovery_replies(session, lease)
                lost = texts.worker_lost_error(lease.attempt)
                never = texts.never_started_error(lease.attempt)
            else:  # live or gone: recover.lua only puts the entry right
                returned = dead = unstarted = b""
                lost = never = ""
            req = lease.req if lease is not None else "-"
            queued.append((lease, ctx.scripts.recover(
                session, token=token, req=req, returned_reply=returned, dead_reply=dead,
                unstarted_reply=unstarted, returned_error=lost,
                unstarted_error=never).on(fix)))
        replies_all = fix.execute(raise_on_error=False)
        recovered = 0
        feed = ctx.client.pipeline(transaction=False)
        for (session, _t), (lease, got_q) in zip(due, queued, strict=True):
            reply = replies_all[got_q.index]
            if isinstance(reply, Exception):
                found = poison_of(reply)
                if found is None:
                    raise reply
                # parked: a lease that does not parse, and the next read finds its action
                # back; an action's counters or spec, and the action is dead-lettered, its
                # lease ended and its resolver told
                req, told = "", b""
                if lease is not None:
                    req, told = lease.req, self._replies(session, lease)(texts.parked(found))
                park_poison(ctx, session, found, req, told)
                continue
            got = got_q.get(replies_all)
            if lease is None or got.outcome in (RecoverOutcome.GONE, RecoverOutcome.LIVE):
                continue
            recovered += 1
            with tracing.recovering(lease, session, got.outcome is RecoverOutcome.DEAD_LETTERED,
                                    got.outcome is not RecoverOutcome.UNSTARTED):
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
        waiting: list[set[bytes]] = [set() for _ in range(ctx.keys.partitions)]
        for member, (p, look_at) in self.in_flight.items():
            if look_at > now:
                waiting[p].add(member)
        parts = self._may_be_due(now)
        pipe = ctx.client.pipeline(transaction=False)
        for p in parts:
            pipe.zrangebyscore(ctx.keys.expiries(p), "-inf", now, start=0,
                               num=DUE_BATCH + len(waiting[p]))
        due: list[bytes] = []
        for p, members in zip(parts, pipe.execute() if parts else [], strict=True):
            if len(members) < DUE_BATCH + len(waiting[p]):  # all that is due: the rest is gone
                for member in waiting[p].difference(members):
                    del self.in_flight[member]
            due.extend(m for m in members if m not in waiting[p])
        ended = self._end(due, now) if due else 0
        if parts:
            self._mark(parts, now)
        return ended

    def _may_be_due(self, now: int) -> list[int]:
        """The partitions whose expiry index may hold an entry due by ``now``: those whose mark
        (``Keys.expiries_due``) is not after it, is absent or does not parse; every one once
        a ``FULL_SWEEP_S``. One read for all the marks on a single Redis (MGET)."""
        ctx, every = self.ctx, list(range(self.ctx.keys.partitions))
        if time.monotonic() >= self.next_full_sweep:
            self.next_full_sweep = time.monotonic() + FULL_SWEEP_S
            return every
        names = [ctx.keys.expiries_due(p) for p in every]
        if is_cluster(ctx.client):  # an MGET's keys must share a slot there
            pipe = ctx.client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            marks: list[Any] = pipe.execute(raise_on_error=False)  # another type: unknown
        else:
            marks = ctx.client.mget(names)
        return [p for p, mark in zip(every, marks, strict=True)
                if not (isinstance(mark, bytes) and mark.isdigit() and int(mark) > now)]

    def _mark(self, parts: list[int], now: int) -> None:
        """Set the marks of the partitions just read, from their indexes: the members this
        loop waits on (in flight past their ttl) count by when it looks at them again."""
        ctx = self.ctx
        waits: list[list[bytes]] = [[] for _ in range(ctx.keys.partitions)]
        again = [NOTHING_DUE] * ctx.keys.partitions
        for member, (p, look_at) in self.in_flight.items():
            waits[p].append(member)
            again[p] = min(again[p], max(look_at, now))
        pipe = ctx.client.pipeline(transaction=False)
        for p in parts:
            ctx.scripts.mark_expiries(p, look_again_ms=again[p], waiting=waits[p]).on(pipe)
        pipe.execute()

    def _end(self, due: list[bytes], now: int) -> int:
        """End the due actions (``expire.lua``) and publish each ending on the feed; one in
        flight is looked at again a lease later."""
        ctx = self.ctx
        pairs = [Keys.parse_lease_member(m) for m in due]
        pipe = ctx.client.pipeline(transaction=False)
        calls = [ctx.scripts.expire(session, action_id=action_id).on(pipe)
                 for session, action_id in pairs]
        replies = pipe.execute()
        feed = ctx.client.pipeline(transaction=False)
        ended = 0
        for member, (session, action_id), queued in zip(due, pairs, calls, strict=True):
            got = queued.get(replies)
            if got.outcome is ExpireOutcome.IN_FLIGHT:
                self.in_flight[member] = (ctx.keys.partition(session), now + ctx.settings.lease_ms)
                continue
            self.in_flight.pop(member, None)
            if got.outcome is ExpireOutcome.ENDED:  # GONE and LATER: the script did all there is
                ended += 1
                publish(feed, ctx.keys, Event.EXPIRED, session=session, id=action_id)
                tracing.expired(session, action_id, _staged_in(got.spec, action_id, session))
        if len(feed):
            feed.execute()
        return ended

    def _lease(self, session: str, token: str, raw: bytes | None) -> Lease | None:
        """The lease, or None when there is none; one that does not parse is parked (the
        action it held goes back where it was, its index entry goes)."""
        if raw is None:
            return None
        try:
            return Lease.model_validate_json(raw)
        except ValidationError as exc:
            reason = f"lease does not parse: {exc.errors()[0]['msg']}"
            self.ctx.scripts.park(session, what="lease", field=token, raw=raw, reason=reason).run()
            log.warning("session %s: unreadable lease %s parked (%s)", session, token, reason)
            return None

    def _replies(self, session: str, lease: Lease,
                 raw: Any = None) -> Callable[[str], bytes]:
        """The error reply with a given text for the resolver waiting on ``lease``."""
        try:
            spec = Spec.read(raw, lease.id, session) if raw else None
        except ValidationError:
            spec = None  # parked by the worker that next begins it
        details = base_details(lease.action, lease.reason, lease.extra_value, spec)
        return lambda text: text_result(text, details, is_error=True).to_json()

    def _recovery_replies(self, session: str, lease: Lease) -> tuple[bytes, bytes, bytes]:
        raw: Any = self.ctx.client.hget(self.ctx.keys.actions(session), lease.id)
        reply = self._replies(session, lease, raw)
        dead = (texts.spec_missing(lease.action, lease.id) if raw is None and lease.kind == "action"
                else texts.dead_lettered(lease.action, lease.id, self.ctx.settings.max_stalls))
        return (reply(texts.worker_lost(lease.action, lease.attempt, lease.id)), reply(dead),
                reply(texts.never_started(lease.action, lease.attempt, lease.id)))


def _staged_in(raw: bytes | None, action_id: str, session: str) -> str | None:
    """The trace context a spec was staged in (None: none, or a spec that does not parse)."""
    try:
        return Spec.read(raw, action_id, session).trace if raw else None
    except ValidationError:
        return None
