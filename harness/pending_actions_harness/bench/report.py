"""What a run leaves: the rows (each figure of ours beside its same-run baseline), one table on
stdout, ``results.json`` and ``latency.png``."""

from __future__ import annotations

import importlib
import math
import statistics
import textwrap
from pathlib import Path
from typing import Any

import orjson

from pending_actions_harness.bench import throughput
from pending_actions_harness.bench.runner import MEMORY_SHAPES, Run
from pending_actions_harness.bench.stats import Dist, Row, fmt, fmt_ratio

KIB = 1024


def _d(r: Run, key: str) -> Dist | None:
    return r.dists.get(key)


def _p(r: Run, key: str, q: str) -> float | None:
    d = _d(r, key)
    if d is None or not d.samples_ms:
        return None
    return {"p50": d.p50, "p99": d.p99, "tput": d.throughput}[q]


def _within(ratio: float | None, pct: float) -> bool | None:
    return None if ratio is None else abs(ratio - 1) <= pct / 100


def rows(r: Run) -> list[Row]:
    out: list[Row] = []
    rabbit_skip = r.skipped.get("rabbitmq", "")
    stock = "stock dramatiq RedisBroker"
    rabbit = "stock dramatiq RabbitMQ"
    ping, evalsha = _p(r, "redis.ping", "p50"), _p(r, "redis.evalsha", "p50")
    out.append(Row("redis.ping.p50", "Redis PING round trip p50", ping, "ms", "-", None))
    out.append(Row("redis.evalsha.p50", "Redis EVALSHA (1-key write) p50", evalsha, "ms",
                   "Redis PING p50", ping))
    ping_idle = _p(r, "redis.ping.idle", "p50")
    evalsha_idle = _p(r, "redis.evalsha.idle", "p50")
    out.append(Row("redis.ping.idle.p50", "Redis PING after an idle pause p50", ping_idle, "ms",
                   "Redis PING p50 (back to back)", ping))
    out.append(Row("redis.evalsha.idle.p50", "Redis EVALSHA after an idle pause p50",
                   evalsha_idle, "ms", "Redis EVALSHA p50 (back to back)", evalsha))

    idle50, idle99 = _p(r, "ours.idle", "p50"), _p(r, "ours.idle", "p99")
    s50, s99 = _p(r, "stock.redis.idle", "p50"), _p(r, "stock.redis.idle", "p99")
    out.append(Row("resolve.idle.p50", "resolve idle p50", idle50, "ms", f"{stock} idle p50",
                   s50))
    every50 = _p(r, "ours.idle.everysec", "p50")
    out.append(Row("resolve.idle.everysec.p50", "resolve idle p50, Redis appendfsync everysec",
                   every50, "ms", f"{stock} idle p50", s50))
    rabbit50 = _p(r, "stock.rabbitmq.idle", "p50")
    # against dramatiq on RabbitMQ, same run: at most as slow without AOF and under everysec
    # (under always no target stands: three fsync'd writes in a row are the floor)
    for key, label, value, most in (
            ("resolve.idle.p50.rabbitmq", "resolve idle p50", idle50, None),
            ("resolve.idle.everysec.p50.rabbitmq", "resolve idle p50, appendfsync everysec",
             every50, 1.0),
            ("resolve.idle.noaof.p50.rabbitmq", "resolve idle p50, Redis without AOF",
             _p(r, "ours.idle.noaof", "p50"), 1.0)):
        row = Row(key, label, value, "ms", f"{rabbit} idle p50", rabbit50,
                  target=f"<= {most:.1f}x" if most else "", note=rabbit_skip)
        row.met = None if row.ratio is None or most is None else row.ratio <= most
        out.append(row)
    # against the same chain with no work in it (bench/floor.py), same run: what ours adds
    for key, label, ours, floor, most in (
            ("floor.idle.p50", "resolve idle p50", idle50, "floor.idle", 1.5),
            ("floor.idle.everysec.p50", "resolve idle p50, appendfsync everysec", every50,
             "floor.idle.everysec", None),
            ("floor.idle.noaof.p50", "resolve idle p50, Redis without AOF",
             _p(r, "ours.idle.noaof", "p50"), "floor.idle.noaof", 2.0)):
        row = Row(key, label, ours, "ms", f"its floor: the same chain, no work ({floor} p50)",
                  _p(r, floor, "p50"), target=f"<= {most:.1f}x" if most else "")
        row.met = None if row.ratio is None or most is None else row.ratio <= most
        out.append(row)
    out += _peer_rows(r)
    out.append(Row("resolve.idle.p50.floor", "resolve idle p50", idle50, "ms",
                   "Redis EVALSHA after the same pauses p50 (floor)", evalsha_idle))
    row = Row("resolve.idle.p99", "resolve idle p99", idle99, "ms", f"{stock} idle p99", s99,
              target="<= 15 ms")
    row.met = None if idle99 is None else idle99 <= 15
    out.append(row)
    out.append(Row("resolve.idle.p99.rabbitmq", "resolve idle p99", idle99, "ms",
                   f"{rabbit} idle p99", _p(r, "stock.rabbitmq.idle", "p99"), note=rabbit_skip))

    tput = _p(r, "ours.loaded", "tput")
    c = r.sizes.callers
    row = Row("resolve.loaded.throughput", f"resolve loaded throughput ({c} callers)", tput,
              "/s", f"{stock} no-op throughput", _p(r, "stock.redis.loaded", "tput"),
              better="higher", target=">= 1.0x")
    row.met = None if row.ratio is None else row.ratio >= 1.0
    out.append(row)
    out.append(Row("resolve.loaded.throughput.rabbitmq", "resolve loaded throughput", tput,
                   "/s", f"{rabbit} no-op throughput", _p(r, "stock.rabbitmq.loaded", "tput"),
                   better="higher", note=rabbit_skip))
    for q in ("p50", "p99"):
        row = Row(f"resolve.loaded.{q}", f"resolve loaded {q}", _p(r, "ours.loaded", q),
                  "ms", f"{stock} loaded {q}", _p(r, "stock.redis.loaded", q),
                  target="<= 1.2x" if q == "p50" else "")
        row.met = None if q != "p50" or row.ratio is None else row.ratio <= 1.2
        out.append(row)

    out += _scaling_rows(r, stock)

    f = r.facts
    ours_cost, stock_cost = f.get("per_resolve.ours", {}), f.get("per_message.stock.redis", {})
    per_resolve = ours_cost.get("commands")
    out.append(Row("commands.per_resolve", "Redis commands per resolve (loaded, one Redis)",
                   per_resolve, "cmd", f"{stock} commands per no-op message and its result",
                   stock_cost.get("commands")))
    out.append(Row("redis_cpu.per_resolve",
                   "Redis CPU time per resolve (loaded, one Redis; user + system)",
                   ours_cost.get("redis_cpu_us"), "us", f"{stock} per no-op message and its "
                   "result", stock_cost.get("redis_cpu_us")))
    out.append(Row("roundtrips.per_resolve",
                   "Redis round trips per resolve (client reads; a pipeline is one)",
                   ours_cost.get("reads"), "reads", f"{stock} client reads per no-op message "
                   "and its result", stock_cost.get("reads")))
    spread = f.get("cluster.spread", {})
    cluster_skip = r.skipped.get("cluster", "")
    out.append(Row("cluster.commands.per_resolve",
                   "Redis commands per resolve (loaded, 3-master cluster)",
                   spread.get("commands_per_resolve"), "cmd", "same on one Redis", per_resolve,
                   note=cluster_skip))
    row = Row("cluster.spread", f"commands on the busiest master / mean, "
              f"{spread.get('sessions', 1000):,} sessions, 3 masters",
              spread.get("max_over_mean"), "x", "commands on every master alike", 1.0,
              target="<= 1.5x", note=cluster_skip)
    row.met = None if row.value is None else row.value <= 1.5
    out.append(row)
    out.append(Row("cluster.idle.p50", "resolve idle p50, 3-master cluster",
                   _p(r, "cluster.idle", "p50"), "ms", "same on one Redis", idle50,
                   note=cluster_skip))
    out.append(Row("cluster.loaded.throughput",
                   f"resolve loaded throughput, 3-master cluster ({c} callers)",
                   _p(r, "cluster.loaded", "tput"), "/s", "same on one Redis", tput,
                   better="higher", note=cluster_skip))
    out.append(Row("cluster.loaded.p50", "resolve loaded p50, 3-master cluster",
                   _p(r, "cluster.loaded", "p50"), "ms", "same on one Redis",
                   _p(r, "ours.loaded", "p50"), note=cluster_skip))

    row = Row("stage.pipelined", "stage, one producer pipelined", f.get("stage_pipelined_per_s"),
              "/s", "Redis EVALSHA pipelined (1-key write)", f.get("raw_pipelined_evalsha_per_s"),
              better="higher", target=">= 30,000/s")
    row.met = None if row.value is None else row.value >= 30_000
    out.append(row)
    ev = _d(r, "redis.evalsha")
    seq = 1000 / (sum(ev.samples_ms) / len(ev.samples_ms)) if ev and ev.samples_ms else None
    out.append(Row("stage.single", "stage, one call at a time (client)",
                   f.get("stage_single_per_s"), "/s", "Redis EVALSHA one at a time", seq,
                   better="higher"))

    stock_mem = f.get("memory.stock", {}).get("beyond_payload")
    for label in MEMORY_SHAPES:
        mem = f.get(f"memory.{label}", {}).get("beyond_payload")
        what = label.replace("_ttl", ", each with a ttl").replace("_", " ")
        row = Row(f"memory.{label}", f"memory/action beyond payload, {what}",
                  mem, "B", "stock dramatiq queued message beyond payload", stock_mem,
                  target="<= 1 KiB")
        row.met = None if mem is None else mem <= KIB
        out.append(row)

    for kind, points, unit in (("depth", r.sizes.depths, "depth"),
                               ("sessions", r.sizes.sessions, "sessions")):
        first = points[0]
        base = _p(r, f"{kind}.{first}", "p50")
        for n in points:
            row = Row(f"{kind}.{n}.p50", f"resolve p50 at {n:,} {unit}",
                      _p(r, f"{kind}.{n}", "p50"), "ms", f"same at {first:,} {unit}", base,
                      target="within 20%" if n != first else "")
            row.met = _within(row.ratio, 20) if n != first else None
            out.append(row)
        last = points[-1]
        out.append(Row(f"{kind}.{last}.p99", f"resolve p99 at {last:,} {unit}",
                       _p(r, f"{kind}.{last}", "p99"), "ms", f"same at {first:,} {unit}",
                       _p(r, f"{kind}.{first}", "p99")))

    ours_idle = f.get("idle_commands.ours", {}).get("per_second_per_process")
    row = Row("idle.commands", "idle workers: Redis commands/s per process", ours_idle,
              "cmd/s", f"{stock} idle, per process",
              f.get("idle_commands.stock.redis", {}).get("per_second_per_process"),
              target="<= 20")
    row.met = None if ours_idle is None else ours_idle <= 20
    out.append(row)
    swept = f.get("idle_commands.ours.sessions")
    if swept is not None:
        n = max(r.sizes.sessions)
        row = Row("idle.commands.sessions", f"same, {n:,} sessions stored",
                  swept["per_second_per_process"], "cmd/s", "same, empty Redis", ours_idle,
                  target="<= 20")
        row.met = swept["per_second_per_process"] <= 20
        out.append(row)
    out += _feature_rows(r, idle50)
    return out


def _feature_rows(r: Run, idle50: float | None) -> list[Row]:
    """What the optional features cost (``bench.features``): policies, their globs, tracing,
    the MCP proxy."""
    out: list[Row] = []
    blocks = r.facts.get("policy", {}).get("block_ratios", [])
    row = Row("policy.stage.p50", f"stage p50, a 50-rule policy ({len(blocks)} blocks "
              "alternating with none" + (f", block ratios {min(blocks):.2f}-{max(blocks):.2f}x"
                                         if blocks else "") + ")",
              _p(r, "policy.stage.ruled", "p50"), "ms", "same, a tenant with no policy",
              _p(r, "policy.stage.plain", "p50"), target="<= 1.10x")
    row.met = None if row.ratio is None else row.ratio <= 1.10
    out.append(row)
    g = r.facts.get("globs", {})
    worst = g.get("worst", {})
    size, small = g.get("size", 0) // KIB, g.get("small", 0) // KIB
    row = Row("policy.glob.worst", f"policy decision, the worst of {len(g.get('globs', []))} "
              f"adversarial globs on a {size} KiB string ({worst.get('glob', '')[:24]})",
              worst.get(f"ms_{g.get('size')}"), "ms", f"same glob on a {small} KiB string",
              worst.get(f"ms_{g.get('small')}"), target="<= 5 ms")
    row.met = None if row.value is None else row.value <= 5
    out.append(row)
    out.append(Row("tracing.idle.p50", "resolve idle p50, the workers exporting traces (OTLP)",
                   _p(r, "tracing.idle", "p50"), "ms", "resolve idle p50, no OTEL_* set",
                   idle50, note=r.skipped.get("tracing", "")))
    spans = r.facts.get("handler_spans_us", {})
    row = Row("tracing.handler.unsampled", "tracing's cost to one handler run, workers "
              "exporting, its resolve not sampled", spans.get("unsampled"), "us",
              "same, no OTEL_* set (the context passed on)", spans.get("none"),
              target="<= 20 us", note=r.skipped.get("tracing", ""))
    row.met = None if row.value is None else row.value <= 20
    out.append(row)
    out.append(Row("tracing.handler.sampled", "tracing's cost to one handler run, workers "
                   "exporting, its resolve sampled", spans.get("sampled"), "us",
                   "same, no OTEL_* set (the context passed on)", spans.get("none"),
                   note=r.skipped.get("tracing", "")))
    loaded = r.facts.get("tracing_loaded", {})
    on, off = loaded.get("sampled", []), loaded.get("off", [])
    row = Row("tracing.loaded.sampled", f"loaded throughput, workers exporting a tenth of the "
              f"traces ({len(on)} blocks alternating with none)",
              statistics.median(on) if on else None, "/s", "same, no OTEL_* set",
              statistics.median(off) if off else None, target=">= 0.95x",
              note=r.skipped.get("tracing", ""))
    row.met = None if row.ratio is None else row.ratio >= 0.95
    out.append(row)
    skip = r.skipped.get("mcp", "")
    out.append(Row("mcp.read.p50", "MCP read through mcp-proxy p50",
                   _p(r, "mcp.read.proxied", "p50"), "ms", "same read straight to the upstream",
                   _p(r, "mcp.read.direct", "p50"), note=skip))
    out.append(Row("mcp.resolve.p50", "MCP resolve through mcp-proxy p50, sent to its answer",
                   _p(r, "mcp.resolve", "p50"), "ms", "resolve idle p50 (Python client)",
                   idle50, note=skip))
    return out


def _peer_rows(r: Run) -> list[Row]:
    """Beside LangGraph's human-in-the-loop on its Postgres checkpointer (``bench.langgraph``):
    a stage, an idle resume, resumes per second with as many callers, bytes per waiting
    action."""
    peer, skip = "LangGraph on Postgres", r.skipped.get("langgraph", "")
    facts = r.facts.get("langgraph", {})
    n, best = facts.get("callers", 16), facts.get("loaded_best", "threads or processes")
    theirs = _p(r, "langgraph.idle", "p50")
    out = [Row("peer.stage.p50", "stage p50 (one call)", _p(r, "ours.stage", "p50"), "ms",
               f"{peer}: run to the interrupt p50", _p(r, "langgraph.stage", "p50"), note=skip)]
    for key, label, ours in (
            ("peer.idle.p50", "resolve idle p50", _p(r, "ours.idle", "p50")),
            ("peer.idle.everysec.p50", "resolve idle p50, appendfsync everysec",
             _p(r, "ours.idle.everysec", "p50"))):
        row = Row(key, label, ours, "ms", f"{peer}: idle resume p50", theirs,
                  target="<= 0.5x", note=skip)
        row.met = None if row.ratio is None else row.ratio <= 0.5
        out.append(row)
    row = Row("peer.loaded.throughput", f"resolve loaded throughput ({n} callers)",
              _p(r, "ours.loaded.peer", "tput"), "/s", f"{peer}: resumes/s, {n} {best}",
              _p(r, "langgraph.loaded", "tput"), better="higher", target=">= 10x", note=skip)
    row.met = None if row.ratio is None else row.ratio >= 10
    out.append(row)
    out.append(Row("peer.bytes", "bytes per pending action (Redis memory)",
                   r.facts.get("memory.1_per_session", {}).get("per_action"), "B",
                   f"{peer}: checkpoint tables per waiting thread",
                   facts.get("bytes_per_action", {}).get("per_action"), note=skip))
    return out


def _scaling_rows(r: Run, stock: str) -> list[Row]:
    """Loaded throughput and p50 per worker layout, each beside stock dramatiq with as many
    dramatiq processes, measured next to it."""
    out: list[Row] = []
    c, threads = r.sizes.callers, r.options.threads
    for layout in throughput.LAYOUTS:
        ours, base = throughput.ours_key(layout), throughput.stock_key(layout.processes)
        what = layout.describe(threads)
        n = layout.processes
        theirs = f"{stock} no-op, {n} process{'es' if n > 1 else ''} x {threads}"
        row = Row(f"scaling.{layout.key}.throughput",
                  f"resolve loaded throughput, {what} ({c} callers)", _p(r, ours, "tput"),
                  "/s", theirs, _p(r, base, "tput"), better="higher",
                  target=">= 1.0x" if layout.key == "p2" else "")
        row.met = None if layout.key != "p2" or row.ratio is None else row.ratio >= 1.0
        out.append(row)
        out.append(Row(f"scaling.{layout.key}.p50", f"resolve loaded p50, {what}",
                       _p(r, ours, "p50"), "ms", theirs, _p(r, base, "p50")))
    pairs = r.facts.get("scaling", {}).get("pairs", {})
    if pairs.get("pairs"):
        ratios = [p["ratio"] for p in pairs["pairs"]]
        # value and baseline are the two sides' medians, so the ratio printed is theirs; the
        # pairs' own ratios (each side by side) are in the figure's text
        out.append(Row("scaling.pairs.throughput",
                       f"resolve loaded throughput, 1 dramatiq process x {threads}, median of "
                       f"{len(ratios)} alternating pairs (pair ratios {min(ratios):.2f}-"
                       f"{max(ratios):.2f}x, median {pairs['ratio']:.2f}x)", pairs["ours"],
                       "/s", f"{stock} no-op, 1 process x {threads}, same pairs",
                       pairs["stock"], better="higher"))
    return out


def breakdown(r: Run) -> list[str]:
    """The idle resolve step by step (``bench.trace``), as lines after the main table."""
    b = r.facts.get("idle_breakdown")
    if not b:
        return []
    gaps = r.sizes.idle_gap_s

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f} ms"

    def share(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    cells = [[label, ms(x["median_ms"]), ms(x["mean_ms"]), share(x["share_of_mean"]),
              str(x["n"])] for label, x in (*b["steps"].items(), ("total (caller's clock)",
                                                                   b["total"]))]
    cols = ["step of one idle resolve", "median", "mean", "share of mean", "n"]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join("-" * w for w in widths)
    about = (f"Idle resolve step by step: {b['resolves']} resolves after {gaps[0]}-{gaps[1]} s "
             "pauses, traced with Redis MONITOR on (a breakdown of where the time goes, not the "
             "idle p50: MONITOR slows Redis). Each step ends as Redis starts the next command; "
             "a write's fsync falls in the step after it. Each median is of its own step, so "
             "the medians need not add up to the total's; the shares of the mean do.")
    return [
        "", *textwrap.wrap(about, 100),
        line, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)), line,
        *("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
          for row in cells),
        line,
    ]


def table(r: Run, all_rows: list[Row]) -> str:
    m = r.facts.get("meta", {})
    head = (f"pending-actions bench ({m.get('mode')}, commit {m.get('commit')}): "
            f"{m.get('cpus')} CPUs {m.get('cpu')}, "
            f"redis {m.get('redis')} appendfsync {m.get('appendfsync')}, "
            f"{m.get('worker_processes')} dramatiq process(es) x {m.get('worker_threads')} "
            "threads for ours and stock (ours adds its resolve worker process)")
    load = m.get("loadavg_before_after")
    if load:
        head += f"\nload average before/after the run: {load[0]:.2f}/{load[1]:.2f}"
    legend = ("ratio = ours / baseline, both measured in this run "
              "(lower is better for ms, B and cmd/s; higher for /s)")
    cols = ["ratio", "figure", "ours", "baseline (same run)", "baseline value", "target", "met"]
    cells = [[fmt_ratio(x), x.figure, fmt(x.value, x.unit), x.baseline,
              fmt(x.baseline_value, x.unit), x.target,
              {True: "yes", False: "NO", None: ""}[x.met] + (" (skipped)" if x.note else "")]
             for x in all_rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join("-" * w for w in widths)
    out = [head, legend, line, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)),
           line]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]
    out.append(line)
    out += breakdown(r)
    out += [f"skipped {k}: {v}" for k, v in r.skipped.items()]
    # A failed round trip is left out of its figure, so say how many there were.
    out += [f"errors in {k}: {d.errors} of {d.errors + len(d.samples_ms)} round trips failed"
            for k, d in r.dists.items() if d.errors]
    return "\n".join(out)


def write_json(r: Run, all_rows: list[Row], path: Path, plot: str | None) -> None:
    def dist(d: Dist) -> dict[str, Any]:
        return {**{k: _clean(v) for k, v in d.summary().items()},
                "samples_ms": [round(x, 4) for x in d.samples_ms]}

    doc = {"meta": r.facts.get("meta", {}), "rows": [x.as_json() for x in all_rows],
           "distributions": {k: dist(d) for k, d in r.dists.items()},
           "facts": {k: v for k, v in r.facts.items() if k != "meta"},
           "skipped": r.skipped, "plot": plot}
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


# Distribution, legend label, colour (one per system), line style (dotted: back to back,
# solid: idle, dashed: loaded).
_CURVES = (
    ("redis.ping", "Redis PING, back to back", "tab:gray", ":"),
    ("redis.evalsha", "Redis EVALSHA, back to back", "black", ":"),
    ("redis.ping.idle", "Redis PING, idle", "tab:gray", "-"),
    ("redis.evalsha.idle", "Redis EVALSHA, idle", "black", "-"),
    ("ours.idle", "ours: resolve, idle", "tab:blue", "-"),
    ("ours.idle.everysec", "ours: resolve, idle, Redis fsync everysec", "tab:cyan", "-"),
    ("langgraph.idle", "LangGraph on Postgres: resume, idle", "tab:green", "-"),
    ("stock.redis.idle", "stock dramatiq RedisBroker, idle", "tab:red", "-"),
    ("stock.rabbitmq.idle", "stock dramatiq RabbitMQ, idle", "tab:purple", "-"),
    ("ours.loaded", "ours: resolve, loaded", "tab:blue", "--"),
    ("stock.redis.loaded", "stock dramatiq RedisBroker, loaded", "tab:red", "--"),
    ("stock.rabbitmq.loaded", "stock dramatiq RabbitMQ, loaded", "tab:purple", "--"),
)


def plot(r: Run, path: Path) -> str | None:
    """Latency distributions (ECDF, log scale) and the two scaling curves. Returns why not,
    or None when written."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    fig, axes = plt.subplots(1, 3, figsize=(18, 7), width_ratios=[2, 1, 1])
    ax = axes[0]
    for key, label, color, style in _CURVES:
        d = r.dists.get(key)
        if d is None or not d.samples_ms:
            continue
        xs = sorted(d.samples_ms)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{label} (p50 {d.p50:.2f} ms)", color=color,
                linestyle=style)
    ax.set_xscale("log")
    ax.set_xlabel("round trip (ms, log scale)")
    ax.set_ylabel("fraction of round trips at or below")
    ax.set_title("Latency distributions (same run)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.13), ncol=2)
    for ax, kind, points in ((axes[1], "depth", r.sizes.depths),
                             (axes[2], "sessions", r.sizes.sessions)):
        got = [(n, r.dists[f"{kind}.{n}"]) for n in points if f"{kind}.{n}" in r.dists]
        for q in ("p50", "p99"):
            ax.plot([n for n, _ in got], [getattr(d, q) for _, d in got], marker="o", label=q)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"{kind} (log scale)")
        ax.set_ylabel("resolve round trip (ms)")
        ax.set_title(f"Resolve latency vs {kind}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"pending-actions bench ({r.facts.get('meta', {}).get('mode')}), "
                 f"appendfsync {r.options.fsync}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
