"""The event feed: a capped stream per partition (``Keys.events``) with every stage and every
outcome of the partition's sessions, for webhooks, metrics and ``top``, which read every
partition's (``Feeds``). Each session's history stays the record; the feed is a feed.

A stage's entries are written by stage.lua itself, in the step that stages, for what it staged
only: a refused stage leaves none, a retried one none again. An outcome's entry is queued by
``publish`` on the pipeline of the script that made the change (the same round trip, on a
cluster too: the feed is in the session's slot), never from inside it. So an outcome is
published together with its finalize/readd, before Redis has said whether the lease still held.
The rare outcome refused as late is followed by a ``late-refused`` entry for the same id: a
reader that counts outcomes subtracts it."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import redis

from pending_actions.broker.connection import is_cluster
from pending_actions.broker.events import Event
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import Spec
from pending_actions.broker.roundtrips import Batch, slot_master

MAXLEN = 100_000  # the whole feed's cap, split evenly over the partitions
# an entry as read: its partition, its id in that partition's stream, its fields
Entry = tuple[int, str, dict[str, str]]


def cap(keys: Keys) -> int:
    """The cap of one partition's feed."""
    return max(1, MAXLEN // keys.partitions)


def publish(pipe: Any, keys: Keys, event: Event, spec: Spec | None = None,
            **fields: str | int | float | None) -> None:
    """Queue one feed entry on ``pipe`` (a pipeline or a client), in the session's partition.
    Without a spec, ``fields`` must name at least the session and the id."""
    entry: list[Any] = ["event", event.value, "at", f"{time.time():.3f}"]
    if spec is not None:
        session = spec.session
        entry += ["session", spec.session, "tenant", spec.tenant, "id", spec.id, "tool",
                  spec.tool, "kind", spec.kind, "created_at", f"{spec.created_at:.3f}"]
    else:
        session = str(fields["session"])
    for name, value in fields.items():
        if value not in ("", None):
            entry += [name, value]
    # XADD as is, not redis-py's xadd(): its keyword handling costs more than the command
    pipe.execute_command("XADD", keys.events(keys.partition(session)), "MAXLEN", "~",
                         cap(keys), "*", *entry)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _fields(raw: Any) -> dict[str, str]:
    """An entry's fields, from redis-py's dict or Redis's own flat list."""
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    return {_text(k): _text(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}


def order(entry_id: str) -> tuple[int, int]:
    """An entry id as a sortable pair (its ms, its sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class Feeds:
    """Every partition's feed, read as one. A follower passes the last id it saw of each
    partition (``read``), a consumer group's member reads what is new to the group
    (``read_group``). On one Redis a read names every partition's stream and blocks; on a
    cluster, where a command's streams must share a slot, each partition is read without
    blocking (the partitions of one master in one round trip) and, when none had anything, the
    reader waits the block time: an entry waits a second at most, and nobody spins."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.streams = [keys.events(p) for p in range(keys.partitions)]
        self.partition_of = {name: p for p, name in enumerate(self.streams)}

    def newest(self) -> dict[int, str]:
        """Each partition's last entry id ("0-0" for an empty feed): where a follower that
        starts now begins."""
        pipe = self.client.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xrevrange(stream, count=1)
        return {p: _text(got[0][0]) if got else "0-0"
                for p, got in enumerate(pipe.execute())}

    def read(self, after: dict[int, str], count: int, block_ms: int,
             stop: threading.Event) -> list[Entry]:
        """The entries after ``after[p]`` in each partition (up to ``count`` of each)."""
        if not is_cluster(self.client):
            got: Any = self.client.xread({s: after[p] for p, s in enumerate(self.streams)},
                                         count=count, block=block_ms)
            return self._entries(got)
        return self._poll(lambda p, s: ("XREAD", "COUNT", count, "STREAMS", s, after[p]),
                          block_ms, stop)

    def read_group(self, group: str, consumer: str, count: int, block_ms: int,
                   stop: threading.Event) -> list[Entry]:
        """What is new to ``group`` in each partition (up to ``count`` of each)."""
        if not is_cluster(self.client):
            got: Any = self.client.xreadgroup(group, consumer, dict.fromkeys(self.streams, ">"),
                                              count=count, block=block_ms)
            return self._entries(got)
        return self._poll(lambda _p, s: ("XREADGROUP", "GROUP", group, consumer, "COUNT", count,
                                         "STREAMS", s, ">"), block_ms, stop)

    def _poll(self, command: Any, block_ms: int, stop: threading.Event) -> list[Entry]:
        by_master: dict[str, tuple[Any, list[int]]] = {}
        for p, stream in enumerate(self.streams):
            node = slot_master(self.client, stream)
            name = repr(node.connection_pool)
            by_master.setdefault(name, (node, []))[1].append(p)
        out: list[Entry] = []
        for node, parts in by_master.values():
            batch = Batch(node, cluster=self.client)
            for p in parts:
                batch.execute_command(*command(p, self.streams[p]))
            for reply in batch.execute():
                out += self._entries(reply)
        if not out:
            stop.wait(block_ms / 1000)
        return out

    def _entries(self, got: Any) -> list[Entry]:
        """Entries from an XREAD's or XREADGROUP's reply (redis-py's, or Redis's own: a map
        over RESP3)."""
        out: list[Entry] = []
        for stream, entries in (got.items() if isinstance(got, dict) else got or ()):
            p = self.partition_of[_text(stream)]
            # a claimed or pending entry deleted meanwhile comes back with no fields: skipped
            out += [(p, _text(e), _fields(f)) for e, f in entries if f]
        return out

    def ensure_group(self, group: str) -> None:
        """``group`` on every partition's feed, starting from now ("$"): a new consumer of the
        feed is told what happens from then on, not the whole capped feed."""
        for stream in self.streams:
            try:
                self.client.xgroup_create(stream, group, id="$", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def claim(self, group: str, consumer: str, idle_ms: int, count: int) -> list[Entry]:
        """Entries ``group`` handed to a member that has not acked them for ``idle_ms``."""
        out: list[Entry] = []
        for p, stream in enumerate(self.streams):
            got: Any = self.client.xautoclaim(stream, group, consumer, idle_ms, "0-0",
                                              count=count)
            out += [(p, _text(e), _fields(f)) for e, f in got[1] if f]
        return out

    def ack(self, group: str, entries: list[Entry]) -> None:
        by_partition: dict[int, list[str]] = defaultdict(list)
        for p, entry_id, _f in entries:
            by_partition[p].append(entry_id)
        pipe = self.client.pipeline(transaction=False)
        for p, ids in by_partition.items():
            pipe.xack(self.streams[p], group, *ids)
        pipe.execute()

    def latest(self, count: int, since_ms: int | None = None) -> list[list[Entry]]:
        """Each partition's newest ``count`` entries (after ``since_ms`` when given), newest
        first."""
        low = "-" if since_ms is None else str(since_ms + 1)
        pipe = self.client.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xrevrange(stream, max="+", min=low, count=count)
        return [[(p, _text(e), _fields(f)) for e, f in got]
                for p, got in enumerate(pipe.execute())]
