"""Settles what ``LOCAL_DISPATCH`` costs and buys (issue 34): the default path (a resolve
worker takes, a dramatiq process claims) and the local one (the dramatiq process takes for its
own free threads), run after run on a fresh Redis and ``pending-actions worker`` each, in
ABBA order (stream, local, local, stream, ...) so that a slow spell of a shared machine falls
on both sides. Each run: idle resolves under ``appendfsync always``, then ``everysec``, then
``PROCESSES`` dramatiq processes loaded by ``--callers`` callers. The machine's load average
is noted before every run. Prints each pair's ratios (local / stream) with their median and
range, and writes everything with ``--out``.

    python -m pending_actions_harness.bench.dispatch_ab [--pairs 6] [--processes 1]
        [--idle 60] [--callers 32] [--per-caller 100] [--out FILE]"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

import orjson

from pending_actions_harness.bench.campaign import fresh_run

MODES = ("stream", "local")
FIGURES = ("idle_p50_ms", "idle_everysec_p50_ms", "loaded_per_s", "loaded_p50_ms")


def one(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    run = fresh_run(mode, "ab", processes=args.processes,
                    settings={"local_dispatch": "true"} if mode == "local" else None,
                    idle=args.idle, gaps_s=(0.1, 0.3), callers=args.callers,
                    per_caller=args.per_caller)
    return {"load_before": load, **run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--idle", type=int, default=60)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--per-caller", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pairs: list[dict[str, dict[str, Any]]] = []
    for p in range(args.pairs):
        order = MODES if p % 2 == 0 else tuple(reversed(MODES))
        pair = {mode: one(mode, args) for mode in order}
        pairs.append(pair)
        print(f"pair {p + 1}: " + "; ".join(
            f"{m}: " + ", ".join(f"{k} {pair[m][k]:.2f}" for k in ("load_before", *FIGURES))
            for m in order), flush=True)
    ratios = {k: [pr["local"][k] / pr["stream"][k] for pr in pairs] for k in FIGURES}
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for k, v in ratios.items()}
    sides = {m: {k: statistics.median(pr[m][k] for pr in pairs) for k in FIGURES}
             for m in MODES}
    doc = {"processes": args.processes, "callers": args.callers, "ratios": summary,
           "medians": sides, "pairs": pairs}
    for k, s in summary.items():
        print(f"local / stream, {k}: median {s['median']:.3f} (range {s['min']:.3f}-"
              f"{s['max']:.3f}); medians {sides['stream'][k]:.2f} -> {sides['local'][k]:.2f}")
    if args.out:
        args.out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
