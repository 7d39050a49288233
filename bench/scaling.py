"""Resolve latency against stack depth and against the number of sessions: state is added
between points (pipelined staging), then resolves are timed one at a time. Each timed resolve
takes an action staged just before it, so the depth (or session count) holds at the point."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from bench.fill import cycle, payload_of, stage_bulk
from bench.handlers import NOOP
from bench.measure import idle, resolver
from bench.progress import Progress
from bench.stats import Dist
from producers import PendingActions

DEPTH_SESSION = "bench-depth"


def _names(start: int, stop: int) -> Iterator[str]:
    for i in range(start, stop):
        yield session_name(i)


def session_name(i: int) -> str:
    return f"bench-sessions-{i}"


def _random_of(rng: random.Random, count: int) -> Callable[[], str]:
    return lambda: session_name(rng.randrange(count))


class _Target:
    """Stages one action on a session, then resolves that session: ``stage`` runs untimed
    before the pause, ``resolve`` is the timed call."""

    def __init__(self, pa: PendingActions, pick: Callable[[], str], payload: dict[str, Any]):
        self.pa = pa
        self.pick = pick
        self.payload = payload
        self.session = ""

    def stage(self) -> None:
        self.session = self.pick()
        self.pa.stage(session=self.session, tool="bench", label="bench action", apply=NOOP,
                      payload=self.payload)

    def resolve(self) -> float:
        return resolver(self.pa, self.session)()


def by_depth(pa: PendingActions, depths: tuple[int, ...], samples: int, gap_s: float,
             payload_size: int, progress: Progress) -> list[tuple[int, Dist]]:
    ctx, payload = pa.ctx, payload_of(payload_size)
    target = _Target(pa, lambda: DEPTH_SESSION, payload)
    below = 0  # actions under the one each sample stages: depth at resolve is below + 1
    out = []
    for depth in depths:
        with progress.phase(f"depth {depth:,}: fill and {samples} resolves",
                            depth - 1 - below + samples) as tick:
            if depth - 1 > below:
                stage_bulk(pa, cycle([DEPTH_SESSION], 1), depth - 1 - below, payload, 1000,
                           tick)
                below = depth - 1
            dist = idle(f"depth {depth}", target.resolve, samples, (gap_s, gap_s), tick,
                        before=target.stage, seed=depth)
        depth_now = int(ctx.client.llen(ctx.keys.stack(DEPTH_SESSION)))
        if depth_now != below:
            raise RuntimeError(f"depth drifted: {depth_now} stacked, expected {below}")
        out.append((depth, dist))
    return out


def by_sessions(pa: PendingActions, counts: tuple[int, ...], samples: int, gap_s: float,
                payload_size: int, progress: Progress) -> list[tuple[int, Dist]]:
    """Every session holds one action; each sample resolves a random one of them (after
    staging on it), so all the sessions' keys and index entries are live."""
    payload = payload_of(payload_size)
    rng = random.Random(7)
    have = 0
    out = []
    for count in counts:
        with progress.phase(f"{count:,} sessions: fill and {samples} resolves",
                            count - have + samples) as tick:
            if count > have:
                stage_bulk(pa, _names(have, count), count - have, payload, 1000, tick)
                have = count
            target = _Target(pa, _random_of(rng, count), payload)
            dist = idle(f"{count} sessions", target.resolve, samples, (gap_s, gap_s), tick,
                        before=target.stage, seed=count)
        out.append((count, dist))
    return out
