"""Loaded throughput as workers are added, on the same cores: 1, 2 and 4 dramatiq worker
processes (``--threads`` each) for stock dramatiq's no-op and for ours, and ours again with the
4 processes shared by 2 resolve workers (two ``pending-actions worker`` processes of 2 dramatiq
processes each: the CLI has no resolve-only mode).

Each layout is a short loaded run of its own, with its workers started for it (through
``bench.procs``, both sides alike) and killed after, on a Redis database flushed before it.
Killed, not stopped: every round trip has been answered by then, and an orderly stop of ours
waits out its resolve worker's blocking read (``block_ms``, 5 s) each time for nothing to
measure.
Stock and ours alternate layout by layout, so that a slow spell of a shared machine falls on
both sides of a pair rather than on one; the one-process pair is run ``PAIRS`` times, the
repeats after the other layouts, and summed up as the median of its pairs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from pending_actions.producers import PendingActions
from pending_actions_harness.bench import fill, measure
from pending_actions_harness.bench.procs import start_ours, start_stock
from pending_actions_harness.bench.progress import Progress
from pending_actions_harness.bench.stats import Dist
from pending_actions_harness.bench.stock import StockClient, new_queue_name

OURS_DB, STOCK_DB = 3, 4  # of the run's private redis-server; flushed before each layout


@dataclass(frozen=True)
class Layout:
    processes: int  # dramatiq worker processes, on each side
    resolvers: int = 1  # ours: resolve worker processes sharing them

    @property
    def key(self) -> str:
        return f"p{self.processes}" + (f"r{self.resolvers}" if self.resolvers > 1 else "")

    def describe(self, threads: int) -> str:
        procs = f"{self.processes} dramatiq process{'es' if self.processes > 1 else ''}"
        if self.resolvers > 1:
            return f"{procs} x {threads} threads, {self.resolvers} resolve workers"
        return f"{procs} x {threads} threads"


LAYOUTS = (Layout(1), Layout(2), Layout(4), Layout(4, resolvers=2))
# the one-process layout's pair (stock, then ours) is run this many times in all, the repeats
# after every other layout: one pair's ratio moves by a fifth and more on a shared machine, the
# median of several measured apart says more
PAIRS = 3


def stock_key(processes: int) -> str:
    return f"scaling.stock.p{processes}"


def ours_key(layout: Layout) -> str:
    return f"scaling.ours.{layout.key}"


def run(r: Any, base_url: str, logs: Path, progress: Progress) -> None:
    """Every layout; fills ``r.dists`` under ``stock_key``/``ours_key`` and sums them up in
    ``r.facts["scaling"]``."""
    s, o = r.sizes, r.options
    r.facts["scaling"] = {"callers": s.callers, "per_caller": s.layout_per_caller,
                          "threads": o.threads, "layouts": {}}
    done: set[int] = set()
    for layout in LAYOUTS:
        if layout.processes not in done:
            done.add(layout.processes)
            _stock(r, f"{base_url}/{STOCK_DB}", layout.processes, logs, progress)
        _ours(r, f"{base_url}/{OURS_DB}", layout, logs, progress)
    for i in range(1, PAIRS):
        _stock(r, f"{base_url}/{STOCK_DB}", 1, logs, progress, pair_key(stock_key(1), i))
        _ours(r, f"{base_url}/{OURS_DB}", LAYOUTS[0], logs, progress,
              pair_key(ours_key(LAYOUTS[0]), i))
    r.facts["scaling"]["pairs"] = pairs(r)
    one = {"stock": r.dists.get(stock_key(1)), "ours": r.dists.get(ours_key(LAYOUTS[0]))}
    for layout in LAYOUTS:
        sides = {"stock": r.dists.get(stock_key(layout.processes)),
                 "ours": r.dists.get(ours_key(layout))}
        r.facts["scaling"]["layouts"][layout.key] = {
            "processes": layout.processes, "resolvers": layout.resolvers,
            **{side: _figures(d, one[side]) for side, d in sides.items()}}


def pair_key(key: str, i: int) -> str:
    """The dist key of the i-th pair's run of a one-process side (the 0th is the layout's)."""
    return key if i == 0 else f"{key}.pair{i}"


def pairs(r: Any) -> dict[str, Any]:
    """The one-process pairs' throughputs, each pair's ratio (ours / stock), and the medians:
    ``ratio`` is the median of the pairs' ratios, each measured side by side."""
    rows = []
    for i in range(PAIRS):
        stock, ours = (r.dists.get(pair_key(k, i)) for k in (stock_key(1), ours_key(LAYOUTS[0])))
        if stock is not None and ours is not None and stock.samples_ms and ours.samples_ms:
            rows.append({"stock": stock.throughput, "ours": ours.throughput,
                         "ratio": ours.throughput / stock.throughput})
    if not rows:
        return {"pairs": []}
    return {"pairs": rows, **{k: statistics.median(p[k] for p in rows)
                              for k in ("stock", "ours", "ratio")}}


def _figures(d: Dist | None, one: Dist | None) -> dict[str, Any]:
    """Throughput and p50 of a layout, and its throughput over the same side's with one
    dramatiq process: how that side scales on these cores."""
    if d is None or not d.samples_ms:
        return {}
    return {"dist": d.name, "throughput_per_s": d.throughput, "p50_ms": d.p50,
            "throughput_vs_1_process": d.throughput / one.throughput
            if one is not None and one.samples_ms else None}


def flush(url: str) -> None:
    """Empties the run's database between the cases that share it."""
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def _stock(r: Any, url: str, processes: int, logs: Path, progress: Progress,
           key: str | None = None) -> None:
    s, o = r.sizes, r.options
    total = s.callers * s.layout_per_caller
    again = " again" if key else ""
    with progress.phase(f"scaling: stock dramatiq (redis), {processes} x {o.threads}, "
                        f"{s.callers} callers{again}", total) as tick:
        flush(url)
        queue = new_queue_name()
        child, _pids = start_stock(url, url, queue, processes, o.threads, logs / "scaling",
                                   f"stock-redis-p{processes}")
        try:
            client = StockClient(url, url, queue)
            try:
                calls: list[measure.Call] = [client.roundtrip] * s.callers
                measure.loaded("warm-up", calls, 2, lambda _n: None)
                r.dists[key or stock_key(processes)] = measure.loaded(
                    f"stock dramatiq redis, {processes} x {o.threads}", calls, s.layout_per_caller,
                    tick)
            finally:
                client.close()
            child.check_alive()
        finally:
            child.kill()


def _ours(r: Any, url: str, layout: Layout, logs: Path, progress: Progress,
          key: str | None = None) -> None:
    s, o = r.sizes, r.options
    each = s.layout_per_caller + 2  # the warm-up's two per caller, then the timed ones
    again = " again" if key else ""
    with progress.phase(f"scaling: ours, {layout.describe(o.threads)}, {s.callers} callers"
                        f"{again}", s.callers * each * 2) as tick:
        flush(url)
        ours = start_ours(url, layout.processes, o.threads, logs / "scaling", layout.resolvers)
        try:
            pa = PendingActions.from_url(url)
            try:
                names = [f"bench-scale-{i}" for i in range(s.callers)]
                calls = fill.loaded_callers(pa, names, s.layout_per_caller, s.payload_bytes,
                                            tick)
                r.dists[key or ours_key(layout)] = measure.loaded(
                    f"ours, {layout.describe(o.threads)}", calls, s.layout_per_caller, tick)
            finally:
                pa.close()
            ours.check_alive()
        finally:
            ours.kill()
