"""Resolve latency against stack depth and against the number of sessions (pipelined staging
builds the state), resolves timed one at a time. Each timed resolve takes an action staged just
before it, so the depth (or session count) holds at the point."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

from pending_actions.producers import PendingActions
from pending_actions_harness.bench.fill import cycle, drop_sessions, payload_of, stage_bulk
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.measure import idle, resolver
from pending_actions_harness.bench.progress import Progress, Tick
from pending_actions_harness.bench.stats import Dist


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


def depth_session(depth: int) -> str:
    return f"bench-depth-{depth}"


def by_depth(pa: PendingActions, depths: tuple[int, ...], samples: int, gap_s: float,
             payload_size: int, progress: Progress) -> list[tuple[int, Dist]]:
    """Each depth has a session of its own, filled to depth - 1 first; each sample stages one
    more and resolves it. The samples go in rounds, one per depth in a shuffled order, so a
    slow spell of a shared machine falls on every depth alike instead of on one point."""
    ctx, payload = pa.ctx, payload_of(payload_size)
    with progress.phase(f"stack depths {', '.join(f'{d:,}' for d in depths)}: fill",
                        sum(d - 1 for d in depths)) as tick:
        for depth in depths:
            stage_bulk(pa, cycle([depth_session(depth)], 1), depth - 1, payload, 1000, tick)
    rng = random.Random(11)
    dists = {depth: Dist(f"depth {depth}") for depth in depths}
    with progress.phase(f"stack depths: {samples} rounds of one resolve per depth",
                        samples * len(depths)) as tick:
        for round_no in range(samples):
            order = list(depths)
            rng.shuffle(order)
            for depth in order:
                target = _Target(pa, functools.partial(depth_session, depth), payload)
                one = idle(f"depth {depth}", target.resolve, 1, (gap_s, gap_s), tick,
                           before=target.stage, seed=round_no)
                dists[depth].samples_ms.extend(one.samples_ms)
                dists[depth].errors += one.errors
    for depth in depths:
        left = int(ctx.client.zcard(ctx.keys.stack(depth_session(depth))))
        if left != depth - 1:
            raise RuntimeError(f"depth drifted: {left} stacked, expected {depth - 1}")
    return [(depth, dists[depth]) for depth in depths]


def by_sessions(pa: PendingActions, counts: tuple[int, ...], samples: int, gap_s: float,
                payload_size: int, progress: Progress,
                at_peak: Callable[[], None] | None = None) -> list[tuple[int, Dist]]:
    """Every session holds one action; each sample resolves a random one of them (after
    staging on it), so all the sessions' keys and index entries are live. The session count
    cannot be interleaved like the depths, so each point is measured twice, half its samples
    on the way up (filling) and half on the way down (dropping sessions), which spreads it
    over two moments of the run instead of one. ``at_peak`` runs while the most sessions are
    stored."""
    payload = payload_of(payload_size)
    rng = random.Random(7)
    have = 0
    dists = {count: Dist(f"{count} sessions") for count in counts}
    half = max(1, samples // 2)

    def measure(count: int, tick: Tick) -> None:
        target = _Target(pa, _random_of(rng, count), payload)
        part = idle(f"{count} sessions", target.resolve, half, (gap_s, gap_s), tick,
                    before=target.stage, seed=count + len(dists[count].samples_ms))
        dists[count].samples_ms.extend(part.samples_ms)
        dists[count].errors += part.errors

    for count in counts:
        with progress.phase(f"{count:,} sessions: fill and {half} resolves",
                            count - have + half) as tick:
            if count > have:
                stage_bulk(pa, _names(have, count), count - have, payload, 1000, tick)
                have = count
            measure(count, tick)
    if at_peak is not None:
        at_peak()
    for count in reversed(counts):
        with progress.phase(f"{count:,} sessions again, on the way down: {half} resolves",
                            half) as tick:
            if count < have:
                drop_sessions(pa.ctx, list(_names(count, have)))
                have = count
            measure(count, tick)
    return [(count, dists[count]) for count in counts]
