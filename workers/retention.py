"""Nothing grows for ever: the recovery loop retires, a page at a time, what finished sessions
leave. retire.lua sets a finished session's history to expire after ``retention_s`` (never
touching a session with anything pending, in flight, in a slot or dead-lettered), and drops a
session with no keys left from its partition's sessions hash (its owner record) and its
tenant's index, in one step. The dead streams are capped where they are written; markers and
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
TURN = "turn"  # the field of Keys.housekeeping with the index of the next hash to page
# (that index, and each hash's scan cursor and size when its pass began)
Pass = tuple[int, dict[str, tuple[int, int]]]


class Retirement:
    PASSES = 24  # passes over the sessions per retention (7 h each at the default 7 days)
    MAX_PAGE = 200  # sessions per page, at most

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.next_at = 0.0
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
        sessions hashes in turn (one each round when a pass spans more rounds than there are
        of them; all of them when a pass is one round). Where a pass stands is kept
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
        keys = [k.sessions(p) for p in range(k.partitions)]
        first, state = self.load()
        first %= len(keys)
        rounds = self.pass_s / s.housekeeping_s
        n = min(len(keys), math.ceil(len(keys) / rounds))
        turn = [keys[(first + i) % len(keys)] for i in range(n)]
        state.update(self.measure([key for key in turn if not state.get(key, (0, 0))[0]]))
        # the pages each hash gets in a pass, whole: a pass never takes longer than planned
        pages = max(1, int(rounds * n / len(keys)))
        dropped = 0
        for key in turn:
            cursor, size = state.get(key, (0, 0))
            if cursor or size:
                gone, cursor = self.page(key, cursor, size, pages)
                dropped += gone
            state[key] = (cursor, size)
        # what older versions kept (the tenants' sets of sessions) leaves the record
        vanished = set(state) - set(keys)
        for key in vanished:
            del state[key]
        self.own = ((first + n) % len(keys), state)
        try:
            pipe = self.ctx.client.pipeline(transaction=False)
            pipe.hset(k.housekeeping, mapping={
                TURN: self.own[0], **{key: f"{state[key][0]} {state[key][1]}" for key in turn}})
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

    def measure(self, starting: list[str]) -> dict[str, tuple[int, int]]:
        """The size of each hash whose pass begins now, which sets its page (and spares the
        scan of one that is empty)."""
        if not starting:
            return {}
        pipe = self.ctx.client.pipeline(transaction=False)
        for key in starting:
            pipe.hlen(key)
        return {key: (0, int(size)) for key, size in zip(starting, pipe.execute(), strict=True)}

    def page(self, key: str, cursor: int, size: int, pages: int) -> tuple[int, int]:
        """One of the ``pages`` of a pass over a partition's sessions hash from ``cursor``:
        retire.lua drops the sessions it finds gone. Returns how many were dropped and the
        cursor after."""
        # one more than its share: a scan stops once it has as many as asked, which for a
        # last page would leave the cursor short of the end, and the pass a page longer
        count = min(self.MAX_PAGE, math.ceil(size / pages) + 1)
        scanned: Any = self.ctx.client.hscan(key, cursor, count=count)
        # each session with its tenant as read: retire.lua takes it out of that tenant's index
        sessions = [(s.decode(), t.decode()) for s, t in scanned[1].items()]
        return len(self.retire(sessions)) if sessions else 0, int(scanned[0])

    def retire(self, sessions: list[tuple[str, str]]) -> list[str]:
        """retire.lua on these sessions (each with the tenant its record held), one call per
        partition; returns those gone."""
        ctx = self.ctx
        by_partition: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for session, tenant in sessions:
            by_partition[ctx.keys.partition(session)].append((session, tenant))
        retention = ctx.settings.retention_s * 1000
        gone: list[str] = []
        for partition, group in by_partition.items():
            codes = ctx.scripts.retire(partition, sessions=group,
                                        retention_ms=retention).run()
            gone += [x for (x, _t), code in zip(group, codes, strict=True) if code == 2]
        return gone
