"""One run: a private redis-server, then each system in turn on it (raw Redis, stock dramatiq
on RedisBroker, on RabbitMQ when reachable, then ours), each with the same worker processes and
threads, measured while nothing else runs; then both sides again with 1, 2 and 4 dramatiq
processes (``throughput``). Everything started here is stopped here."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from pending_actions_harness.bench import (
    cluster,
    features,
    fill,
    floor,
    langgraph,
    measure,
    scaling,
    throughput,
    trace,
)
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.procs import start_ours, start_stock
from pending_actions_harness.bench.progress import Progress
from pending_actions_harness.bench.stats import Dist
from pending_actions_harness.bench.stock import (
    ACTOR,
    RABBITMQ_URL,
    StockClient,
    delete_rabbitmq_queues,
    new_queue_name,
    rabbitmq_unavailable,
    stock_broker,
)


@dataclass(frozen=True)
class Sizes:
    raw: int  # PING / EVALSHA round trips, back to back
    raw_idle: int  # the same, each after an idle pause
    idle: int  # our idle resolves
    stock_idle: int  # stock idle round trips (each waits out dramatiq's poll backoff)
    idle_gap_s: tuple[float, float]  # pause before each idle round trip
    settle_s: float  # after workers are ready, before idle figures
    idle_window_s: float  # idle Redis command count
    callers: int  # concurrent callers under load
    per_caller: int
    stage_pipelined: int
    stage_single: int
    memory_actions: int
    stock_memory_messages: int
    payload_bytes: int
    depths: tuple[int, ...]
    sessions: tuple[int, ...]
    scaling_samples: int
    scaling_gap_s: float
    sweep_window_s: float  # idle commands again with every session stored; 0 skips
    layout_per_caller: int  # round trips per caller in each worker layout's loaded run
    traced: int  # idle resolves traced step by step under MONITOR
    policy_stages: int  # stages per block, with the 50-rule policy and without (features)
    glob_repeat: int  # decisions per adversarial glob and size
    mcp_reads: int  # reads straight and through mcp-proxy
    mcp_applies: int  # resolves through mcp-proxy
    handler_spans: int  # handler runs a round, tracing's cost to each (bench.spans)
    sampled_blocks: int  # loaded blocks with a tenth of traces sampled, and as many without


FULL = Sizes(raw=2000, raw_idle=50, idle=100, stock_idle=40, idle_gap_s=(0.2, 1.0), settle_s=3.0,
             idle_window_s=10.0, callers=32, per_caller=300, stage_pipelined=100_000,
             stage_single=2000, memory_actions=20_000, stock_memory_messages=5000,
             payload_bytes=256, depths=(1, 10, 100, 1000, 10_000, 100_000),
             sessions=(1, 10, 100, 1000, 10_000, 100_000), scaling_samples=200,
             scaling_gap_s=0.005, sweep_window_s=61.0, layout_per_caller=200, traced=30,
             policy_stages=2000, glob_repeat=15, mcp_reads=300, mcp_applies=30,
             handler_spans=20_000, sampled_blocks=3)
QUICK = Sizes(raw=200, raw_idle=5, idle=10, stock_idle=6, idle_gap_s=(0.05, 0.2), settle_s=1.0,
              idle_window_s=2.0, callers=4, per_caller=25, stage_pipelined=5000,
              stage_single=200, memory_actions=2000, stock_memory_messages=500,
              payload_bytes=256, depths=(1, 1000), sessions=(1, 1000), scaling_samples=20,
              scaling_gap_s=0.005, sweep_window_s=0.0, layout_per_caller=10, traced=5,
              policy_stages=100, glob_repeat=3, mcp_reads=20, mcp_applies=5,
              handler_spans=2000, sampled_blocks=1)


# the memory figures: one action per session, ten, all in one session, one per session with
# a ttl (which adds its entry in the expiry index)
MEMORY_SHAPES = ("1_per_session", "10_per_session", "one_session", "1_per_session_ttl")


@dataclass
class Options:
    out: Path
    quick: bool = False
    skip_rabbitmq: bool = False
    rabbitmq_url: str = RABBITMQ_URL
    skip_langgraph: bool = False
    postgres_url: str = langgraph.POSTGRES_URL
    processes: int = 1
    threads: int = 8
    fsync: str = "always"
    progress: bool = True
    cluster: bool = True


@dataclass
class Run:
    options: Options
    sizes: Sizes
    dists: dict[str, Dist] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def _phases(s: Sizes, rabbit: bool, peer: bool) -> int:
    stock = 4 + (3 if rabbit else 0) + (6 if peer else 0)
    ours = 11 + len(MEMORY_SHAPES) + 2 + 2 * len(s.sessions) + (1 if s.sweep_window_s else 0)
    layouts = (len(throughput.LAYOUTS) + len({x.processes for x in throughput.LAYOUTS})
               + 2 * (throughput.PAIRS - 1))  # the one-process pair's repeats
    return 3 + stock + ours + floor.PHASES + layouts + features.PHASES + 3


def run(options: Options) -> Run:
    sizes = QUICK if options.quick else FULL
    r = Run(options, sizes)
    why_not = "skipped by --skip-rabbitmq" if options.skip_rabbitmq else rabbitmq_unavailable(
        options.rabbitmq_url)
    if why_not:
        r.skipped["rabbitmq"] = why_not
    peer_not = "skipped by --skip-langgraph" if options.skip_langgraph else \
        langgraph.unavailable(options.postgres_url)
    if peer_not:
        r.skipped["langgraph"] = peer_not
    progress = Progress(_phases(sizes, not why_not, not peer_not), enabled=options.progress)
    load = os.getloadavg()[0]
    if load > 0.8:  # other work on a 2-core machine moves every figure
        progress.say(f"warning: load average is {load:.2f} before the run; figures will be noisy")
    if why_not:
        progress.say(f"RabbitMQ baseline skipped: {why_not}")
    if peer_not:
        progress.say(f"LangGraph baseline skipped: {peer_not}")
    logs = options.out / "logs"
    with tempfile.TemporaryDirectory(prefix="pa-bench-redis-") as data:
        server = EmbeddedRedis(directory=Path(data), fsync=options.fsync).start()
        try:
            base = f"redis://127.0.0.1:{server.port}"
            r.facts["meta"] = _meta(options, sizes, server)
            _raw(r, f"{base}/0", progress)
            _stock(r, "redis", f"{base}/1", f"{base}/1", new_queue_name(), logs, progress,
                   idle_cmds=True)
            if not why_not:
                queue = new_queue_name()
                try:
                    _stock(r, "rabbitmq", options.rabbitmq_url, f"{base}/1", queue, logs,
                           progress, idle_cmds=False)
                except Exception as exc:  # an optional baseline: say why, keep the run
                    r.skipped["rabbitmq"] = f"failed: {exc!r}"[:300]
                    progress.say(f"RabbitMQ baseline failed: {exc!r}")
                finally:
                    delete_rabbitmq_queues(queue, options.rabbitmq_url)
            _ours(r, f"{base}/0", f"{base}/2", logs, progress)
            floor.run(r, base, logs, progress)  # the chain ours runs, with no work in it
            if not peer_not:
                try:
                    dists, facts = langgraph.run(options.postgres_url, sizes, progress)
                    r.dists.update(dists)
                    r.facts["langgraph"] = facts
                except Exception as exc:  # an optional baseline: say why, keep the run
                    r.skipped["langgraph"] = f"failed: {exc!r}"[:300]
                    progress.say(f"LangGraph baseline failed: {exc!r}")
            throughput.run(r, base, logs, progress)
            features.run(r, base, logs, progress)
        finally:
            server.stop()
    if options.cluster:
        try:
            cluster.run(r, logs, progress)
        except Exception as exc:  # the cluster rows are extra: say why, keep the run
            r.skipped["cluster"] = f"failed: {exc!r}"[:300]
            progress.say(f"cluster figures failed: {exc!r}")
    r.facts["meta"]["loadavg_before_after"] = [load, os.getloadavg()[0]]
    return r


def _meta(options: Options, sizes: Sizes, server: EmbeddedRedis) -> dict[str, Any]:
    info: Any = redis.Redis(port=server.port).info("server")
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    return {"mode": "quick" if options.quick else "full", "commit": _commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
            "cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "redis": info.get("redis_version"), "appendfsync": options.fsync,
            "worker_processes": options.processes, "worker_threads": options.threads,
            "callers": sizes.callers, "sizes": asdict(sizes)}


def _commit() -> str | None:
    """The code measured: HEAD of the checkout, marked when the work tree differs."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    return None


def _raw(r: Run, url: str, progress: Progress) -> None:
    client = redis.Redis.from_url(url)
    try:
        with progress.phase("raw Redis: PING and EVALSHA round trips", r.sizes.raw) as tick:
            r.dists["redis.ping"], r.dists["redis.evalsha"] = measure.raw_redis(
                client, r.sizes.raw, tick)
        n, gaps = r.sizes.raw_idle, r.sizes.idle_gap_s
        with progress.phase("raw Redis: PING and EVALSHA after idle pauses", 2 * n) as tick:
            r.dists["redis.ping.idle"], r.dists["redis.evalsha.idle"] = measure.raw_redis_idle(
                client, n, gaps, tick)
        total = r.sizes.stage_pipelined
        with progress.phase("raw Redis: pipelined EVALSHA", total) as tick:
            r.facts["raw_pipelined_evalsha_per_s"] = measure.raw_pipelined_evalsha(
                client, total, 1000, tick)
    finally:
        client.close()


def _stock(r: Run, name: str, broker_url: str, results_url: str, queue: str, logs: Path,
           progress: Progress, *, idle_cmds: bool) -> None:
    o = r.options
    with progress.phase(f"stock dramatiq ({name}): start workers", o.processes) as tick:
        child, pids = start_stock(broker_url, results_url, queue, o.processes, o.threads, logs,
                                  f"stock-{name}-worker")
        tick(len(pids))
    try:
        _stock_figures(r, name, StockClient(broker_url, results_url, queue), results_url,
                       len(pids), progress, idle_cmds=idle_cmds)
    finally:
        child.stop()


def _stock_figures(r: Run, name: str, client: StockClient, results_url: str, processes: int,
                   progress: Progress, *, idle_cmds: bool) -> None:
    s = r.sizes
    try:
        for _ in range(3):  # connections and queue declarations happen on first use
            client.roundtrip()
        if idle_cmds:
            with progress.phase(f"stock dramatiq ({name}): idle Redis commands",
                                int(s.settle_s + s.idle_window_s), "s") as tick:
                time.sleep(s.settle_s)
                conn = redis.Redis.from_url(results_url)
                r.facts[f"idle_commands.stock.{name}"] = measure.idle_commands(
                    conn, s.idle_window_s, processes, tick)
                conn.close()
        with progress.phase(f"stock dramatiq ({name}): idle send-to-result",
                            s.stock_idle) as tick:
            r.dists[f"stock.{name}.idle"] = measure.idle(
                f"stock dramatiq {name} idle", client.roundtrip, s.stock_idle, s.idle_gap_s,
                tick)
        total = s.callers * s.per_caller
        with progress.phase(f"stock dramatiq ({name}): {s.callers} concurrent callers",
                            total) as tick:
            calls: list[measure.Call] = [client.roundtrip] * s.callers
            measure.loaded("warm-up", calls, 2, lambda _n: None)
            conn = redis.Redis.from_url(results_url)
            before = measure.Counters.read(conn)
            r.dists[f"stock.{name}.loaded"] = measure.loaded(
                f"stock dramatiq {name} loaded", calls, s.per_caller, tick)
            if name == "redis":  # broker and results on this Redis: every command it ran
                r.facts["per_message.stock.redis"] = measure.Counters.read(conn).per_op(
                    before, s.callers * s.per_caller)
            conn.close()
    finally:
        client.close()


def _ours(r: Run, url: str, scratch_url: str, logs: Path, progress: Progress) -> None:
    o = r.options
    with progress.phase("ours: start resolve worker and dramatiq workers",
                        o.processes + 1) as tick:
        ours = start_ours(url, o.processes, o.threads, logs)
        tick(len(ours.pids))
    try:
        _ours_figures(r, url, scratch_url, len(ours.pids), progress)
        ours.check_alive()
    finally:
        ours.stop()


def _ours_figures(r: Run, url: str, scratch_url: str, processes: int,
                  progress: Progress) -> None:
    s = r.sizes
    # the memory figures stage thousands into one session, past the default cap
    pa = PendingActions.from_url(url, max_pending_per_session=10 * s.memory_actions)
    conn = redis.Redis.from_url(url)
    try:
        with progress.phase("ours: idle Redis commands", int(s.settle_s + s.idle_window_s),
                            "s") as tick:
            time.sleep(s.settle_s)
            r.facts["idle_commands.ours"] = measure.idle_commands(conn, s.idle_window_s,
                                                                  processes, tick)
        _ours_latency(r, pa, progress)
        with progress.phase("ours: idle resolves step by step, under MONITOR", s.traced) as tick:
            r.facts["idle_breakdown"] = trace.run(pa, url, s.traced, s.idle_gap_s,
                                                  fill.payload_of(s.payload_bytes), tick)
        _ours_stage_and_memory(r, pa, scratch_url, progress)
        r.dists.update({f"depth.{d}": dist for d, dist in scaling.by_depth(
            pa, s.depths, s.scaling_samples, s.scaling_gap_s, s.payload_bytes, progress)})

        def idle_with_sessions() -> None:
            with progress.phase(f"ours: idle Redis commands with {max(s.sessions):,} sessions "
                                "stored", int(s.sweep_window_s), "s") as tick:
                r.facts["idle_commands.ours.sessions"] = measure.idle_commands(
                    conn, s.sweep_window_s, processes, tick)

        r.dists.update({f"sessions.{n}": dist for n, dist in scaling.by_sessions(
            pa, s.sessions, s.scaling_samples, s.scaling_gap_s, s.payload_bytes, progress,
            at_peak=idle_with_sessions if s.sweep_window_s else None)})
    finally:
        pa.close()
        conn.close()


def _ours_latency(r: Run, pa: PendingActions, progress: Progress) -> None:
    s = r.sizes

    def stage(session: str) -> None:
        pa.stage(session=session, tool="bench", label="bench action", apply=NOOP,
                 payload=fill.payload_of(s.payload_bytes))

    # then the same with Redis fsyncing once a second: four writes on the path of a resolve
    # each wait for an fsync under "always"; that row says how much of the idle figure it is
    r.dists["ours.idle"], r.dists["ours.idle.everysec"] = measure.idle_resolves(
        pa.client, "ours", lambda: stage("bench-idle"), measure.resolver(pa, "bench-idle"), s.idle,
        s.idle_gap_s, progress)
    r.dists["ours.idle.noaof"] = measure.idle_without_aof(
        pa.client, "ours", lambda: stage("bench-idle"), measure.resolver(pa, "bench-idle"), s.idle,
        s.idle_gap_s, progress)
    names = [f"bench-load-{i}" for i in range(s.callers)]
    with progress.phase(f"ours: {s.callers} sessions, {s.callers} concurrent callers",
                        s.callers * (s.per_caller + 2) * 2) as tick:
        calls = fill.loaded_callers(pa, names, s.per_caller, s.payload_bytes, tick)
        before = measure.Counters.read(pa.client)
        r.dists["ours.loaded"] = measure.loaded("ours loaded", calls, s.per_caller, tick)
        # every command Redis ran (scripts' own commands included) over the loaded run
        r.facts["per_resolve.ours"] = measure.Counters.read(pa.client).per_op(
            before, s.callers * s.per_caller)
    fill.drop_sessions(pa.ctx, names)
    if "langgraph" not in r.skipped:  # ours with as many callers as the peer's loaded run
        n, each = langgraph.CALLERS, s.layout_per_caller
        names = [f"bench-peer-{i}" for i in range(n)]
        with progress.phase(f"ours: {n} concurrent callers (the LangGraph comparison)",
                            n * (each + 2) * 2) as tick:
            calls = fill.loaded_callers(pa, names, each, s.payload_bytes, tick)
            r.dists["ours.loaded.peer"] = measure.loaded(f"ours loaded ({n} callers)", calls,
                                                         each, tick)
        fill.drop_sessions(pa.ctx, names)


def _ours_stage_and_memory(r: Run, pa: PendingActions, scratch_url: str,
                           progress: Progress) -> None:
    s = r.sizes
    payload = fill.payload_of(s.payload_bytes)
    with progress.phase("ours: stage one call at a time (PendingActions.stage)",
                        s.stage_single) as tick:
        one = r.dists["ours.stage"] = Dist("ours stage")
        start = time.perf_counter()
        for _ in range(s.stage_single):
            began = time.perf_counter()
            pa.stage(session="bench-stage-single", tool="bench", label="bench action",
                     apply=NOOP, payload=payload)
            one.add_seconds(time.perf_counter() - began)
            tick(1)
        r.facts["stage_single_per_s"] = s.stage_single / (time.perf_counter() - start)
        fill.drop_sessions(pa.ctx, ["bench-stage-single"])
    names = [f"bench-stage-{i}" for i in range(16)]
    with progress.phase("ours: stage pipelined, one producer", s.stage_pipelined) as tick:
        r.facts["stage_pipelined_per_s"] = fill.stage_bulk(
            pa, fill.cycle(names, 1), s.stage_pipelined, payload, 1000, tick)
    fill.drop_sessions(pa.ctx, names)
    n = s.memory_actions
    shapes = ((n, 1, None), (n // 10, 10, None), (1, n, None), (n, 1, 3600.0))
    for label, (sessions, each, ttl) in zip(MEMORY_SHAPES, shapes, strict=True):
        with progress.phase(f"ours: memory, {label.replace('_', ' ')}", n) as tick:
            r.facts[f"memory.{label}"] = fill.memory_per_action(
                pa, f"bench-mem-{label}", sessions, each, payload, tick, ttl)
    with progress.phase("stock dramatiq (redis): memory per queued message",
                        s.stock_memory_messages) as tick:
        broker = stock_broker(scratch_url)
        client = redis.Redis.from_url(scratch_url)
        try:
            r.facts["memory.stock"] = fill.stock_memory_per_message(
                broker, client, "pending-actions-bench-memory", ACTOR, s.stock_memory_messages,
                payload, tick)
        finally:
            broker.close()
            client.close()
