"""Nothing grows for ever: the recovery loop retires, a page at a time, what finished sessions
leave. retire.lua sets a finished session's history to expire after ``retention_s`` (never
touching a session with anything pending, in flight, in a slot or dead-lettered), and drops a
session with no keys left from its partition's sessions hash (its tenant claim with it); the
tenants' sessions sets follow. The dead streams are capped where they are written; markers and
replies have their own ttl.

The pages are paced by the retention, not by the number of sessions: one pass over every
session takes about ``retention_s / PASSES`` (never less than one housekeeping round), so an
idle worker beside many stored sessions sends a few commands a second, not hundreds, and a
finished session's history is gone at most 1 + 1/``PASSES`` retentions after it finished."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from typing import Any

import redis

from pending_actions.broker.context import Context

log = logging.getLogger("pending_actions.resolver")
TURN = "turn"  # the field of Keys.housekeeping with the index of the next hash or set to page
# (that index, and each hash's or set's scan cursor and size when its pass began)
Pass = tuple[int, dict[str, tuple[int, int]]]


class Retirement:
    PASSES = 24  # passes over the sessions per retention (7 h each at the default 7 days)
    MAX_PAGE = 200  # sessions per page, at most

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.next_at = 0.0
        self.sets: list[str] = []  # the tenants' sessions sets, found once a pass
        self.sets_at = 0.0  # when to look for them again
        # the pass as this worker last left it: carried on alone while the shared record is
        # of another type (an operator's doing), rather than stopping the recovery loop
        self.own: Pass = (0, {})
        self.warned = False

    @property
    def pass_s(self) -> float:
        s = self.ctx.settings
        return max(s.housekeeping_s, s.retention_s / self.PASSES)

    def step(self) -> int:
        """At most every ``housekeeping_s``, by one worker at a time: a page of the next
        sessions hashes and sets in turn (one each round when a pass spans more rounds than
        there are of them; all of them when a pass is one round). Where a pass stands is kept
        in Redis (``Keys.housekeeping``), so whichever worker holds the round carries it on.
        Returns how many sessions were dropped."""
        s = self.ctx.settings
        now = time.monotonic()
        if now < self.next_at:
            return 0
        self.next_at = now + s.housekeeping_s
        k = self.ctx.keys
        if not self.ctx.client.set(k.housekeeping_lock, "1", nx=True,
                                   px=int(s.housekeeping_s * 1000)):
            return 0
        if now >= self.sets_at:
            self.sets, self.sets_at = self.tenant_sets(), now + self.pass_s
        keys = [(k.sessions(p), True) for p in range(k.partitions)] + [
            (key, False) for key in self.sets]
        first, state = self.load()
        first %= len(keys)
        rounds = self.pass_s / s.housekeeping_s
        n = min(len(keys), math.ceil(len(keys) / rounds))
        turn = [keys[(first + i) % len(keys)] for i in range(n)]
        state.update(self.measure([(key, hashed) for key, hashed in turn
                                   if not state.get(key, (0, 0))[0]]))
        # the pages each hash or set gets in a pass, whole: a pass never takes longer than planned
        pages = max(1, int(rounds * n / len(keys)))
        dropped = 0
        for key, hashed in turn:
            cursor, size = state.get(key, (0, 0))
            if cursor or size:
                gone, cursor = self.page(key, hashed, cursor, size, pages)
                dropped += gone
            state[key] = (cursor, size)
        # a tenant's set that is gone (every session of it retired) leaves the record with
        # its entry, else the record would keep one for every tenant there ever was
        vanished = set(state) - {key for key, _ in keys}
        for key in vanished:
            del state[key]
        self.own = ((first + n) % len(keys), state)
        try:
            pipe = self.ctx.client.pipeline(transaction=False)
            pipe.hset(k.housekeeping, mapping={
                TURN: self.own[0], **{key: f"{state[key][0]} {state[key][1]}" for key, _ in turn}})
            if vanished:
                pipe.hdel(k.housekeeping, *vanished)
            pipe.execute()
        except redis.ResponseError as exc:
            self._unshared(exc)
        return dropped

    def _unshared(self, exc: redis.ResponseError) -> None:
        if "WRONGTYPE" not in str(exc):
            raise exc
        if not self.warned:
            self.warned = True
            log.warning("%s is not a hash (%s): each resolve worker retires sessions at its "
                        "own pace until it is deleted", self.ctx.keys.housekeeping, exc)

    def load(self) -> Pass:
        """Where the pass stands: the next hash or set to page, and each one's cursor and size
        when its pass began. What does not parse starts again from 0."""
        try:
            raw: Any = self.ctx.client.hgetall(self.ctx.keys.housekeeping)
        except redis.ResponseError as exc:
            self._unshared(exc)
            return self.own[0], dict(self.own[1])
        turn, state = 0, {}
        for field, value in raw.items():
            try:
                if field.decode() == TURN:
                    turn = int(value)
                    continue
                cursor, size = value.decode().split(" ")
                state[field.decode()] = (int(cursor), int(size))
            except ValueError:
                continue
        return turn, state

    def tenant_sets(self) -> list[str]:
        found: Any = self.ctx.client.scan_iter(match=self.ctx.keys.tenant_sessions("*"),
                                               count=1000, _type="set")
        return [x.decode() if isinstance(x, bytes) else x for x in found]

    def measure(self, starting: list[tuple[str, bool]]) -> dict[str, tuple[int, int]]:
        """The size of each hash and set whose pass begins now, which sets its page (and spares
        the scan of one that is empty)."""
        if not starting:
            return {}
        pipe = self.ctx.client.pipeline(transaction=False)
        for key, hashed in starting:
            if hashed:
                pipe.hlen(key)
            else:
                pipe.scard(key)
        return {key: (0, int(size))
                for (key, _), size in zip(starting, pipe.execute(), strict=True)}

    def page(self, key: str, hashed: bool, cursor: int, size: int,
             pages: int) -> tuple[int, int]:
        """One of the ``pages`` of a pass over a partition's sessions hash (``hashed``:
        retire.lua drops the sessions it finds gone) or a tenant's sessions set (dropped
        here), from ``cursor``. Returns how many were dropped and the cursor after."""
        ctx = self.ctx
        # one more than its share: a scan stops once it has as many as asked, which for a
        # last page would leave the cursor short of the end, and the pass a page longer
        count = min(self.MAX_PAGE, math.ceil(size / pages) + 1)
        scanned: Any = (ctx.client.hscan(key, cursor, count=count) if hashed
                        else ctx.client.sscan(key, cursor, count=count))
        after = int(scanned[0])
        sessions = [m.decode() for m in scanned[1]]  # a hash's fields, a set's members
        gone = self.retire(sessions) if sessions else []
        if hashed or not gone:
            return len(gone), after
        ctx.client.srem(key, *gone)
        # a stage may have come in between the look and the SREM (its producer adds the
        # session to its tenant's set), so whatever has keys again now goes back
        pipe = ctx.client.pipeline(transaction=False)
        for session in gone:
            pipe.exists(ctx.keys.actions(session), ctx.keys.history(session),
                        ctx.keys.dead(session))
        back = [x for x, n in zip(gone, pipe.execute(), strict=True) if n]
        if back:
            ctx.client.sadd(key, *back)
        return len(gone) - len(back), after

    def retire(self, sessions: list[str]) -> list[str]:
        """retire.lua on these sessions, one call per partition; returns those gone."""
        ctx = self.ctx
        by_partition: dict[int, list[str]] = defaultdict(list)
        for session in sessions:
            by_partition[ctx.keys.partition(session)].append(session)
        retention = ctx.settings.retention_s * 1000
        gone: list[str] = []
        for partition, group in by_partition.items():
            codes = ctx.scripts.retire(partition, sessions=group,
                                        retention_ms=retention).run()
            gone += [x for x, code in zip(group, codes, strict=True) if code == 2]
        return gone
