"""The slow sweep of in-flight state: a pass over every session's ``inflight`` hash, paced so
that it takes about ``SWEEP_S``, that gives each lease without its entry in its partition's
lease index the entry back (sweep.lua), so that recovery finds it.

Recovery looks only at the lease indexes, and every script that writes or ends a lease writes
its index entry in the same step; but an index deleted by hand, or lost by a Redis that lost
writes, left a lease whose process was gone (killed while stopped, say) in flight for ever: the
action neither pending nor ending, and nothing saying so. The sweep finds the hashes with SCAN
(a pattern and a type, on each master of a cluster), not through any index, which is what it
must not trust. One resolve worker at a time sweeps (``Keys.sweep_lock``), a page a round, and
where the pass stands is kept in Redis (``Keys.sweep``), as retirement keeps its own
(``workers/retention.py``)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis

from pending_actions.broker.connection import is_cluster, server_info
from pending_actions.broker.context import Context

log = logging.getLogger("pending_actions.resolver")

ROUND_S = 1.0  # a page at most this often
PAGE_MIN, PAGE_MAX = 100, 10_000  # keys a SCAN looks at per page


class Sweep:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.next_at = 0.0
        self.found = 0  # index entries put back so far, for logs and tests

    def nodes(self) -> list[Any]:
        """The Redis servers to scan: the one, or a cluster's masters by name."""
        client: Any = self.ctx.client
        if not is_cluster(client):
            return [client]
        return [client.get_redis_connection(n)
                for n in sorted(client.get_primaries(), key=lambda n: n.name)]

    def page_size(self) -> int:
        """Keys per SCAN for a pass that takes about ``SWEEP_S``: the keys of the largest
        master, spread over the pass's rounds."""
        info = server_info(self.ctx.client, "keyspace")
        per_node = [info] if "db0" in info or not info else list(info.values())
        keys = max((int(i.get("db0", {}).get("keys", 0)) for i in per_node), default=0)
        rounds = max(1.0, self.ctx.settings.sweep_s / ROUND_S)
        return max(PAGE_MIN, min(PAGE_MAX, math.ceil(keys / rounds)))

    def step(self) -> int:
        """At most every ``ROUND_S``, by one worker at a time: one SCAN page of one server,
        and sweep.lua for each session's inflight hash it holds. Returns how many index
        entries were put back."""
        now = time.monotonic()
        if now < self.next_at:
            return 0
        self.next_at = now + ROUND_S
        ctx, k = self.ctx, self.ctx.keys
        if not ctx.client.set(k.sweep_lock, "1", nx=True, px=int(ROUND_S * 1000)):
            return 0
        node, cursor, page = self.where()
        nodes = self.nodes()
        node %= len(nodes)
        if not page:  # a pass begins
            page = self.page_size()
        try:
            cursor, found = nodes[node].scan(cursor, match=k.inflight_pattern(), count=page,
                                             _type="hash")
        except redis.ResponseError:  # a cursor of another server (the cluster changed)
            cursor, found = 0, []
        sessions = [s for s in map(k.session_of_inflight, found) if s is not None]
        back = 0
        if sessions:
            pipe = ctx.client.pipeline(transaction=False)
            calls = [ctx.scripts.sweep(s).on(pipe) for s in sessions]
            replies = pipe.execute()
            back = sum(call.get(replies) for call in calls)
            if back:
                log.warning("%d leases had lost their index entry; put back for recovery", back)
        if not cursor:  # this server done: the next one, and a new pass after the last
            node, page = node + 1, 0 if node + 1 >= len(nodes) else page
        try:
            ctx.client.hset(k.sweep, mapping={"node": node % len(nodes), "cursor": cursor,
                                              "page": page})
        except redis.ResponseError as exc:  # of another type: an operator's to delete
            log.warning("%s cannot hold where the sweep stands (%s)", k.sweep, exc)
        self.found += back
        return back

    def where(self) -> tuple[int, int, int]:
        """The server, cursor and page size the pass stands at; a record that is missing, of
        another type or does not parse starts a pass again."""
        try:
            raw: Any = self.ctx.client.hgetall(self.ctx.keys.sweep)
            node, cursor, page = (int(raw.get(f) or 0) for f in (b"node", b"cursor", b"page"))
        except (redis.ResponseError, ValueError):
            return 0, 0, 0
        return node, cursor, page
