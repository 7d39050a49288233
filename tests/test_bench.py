"""The benchmark harness runs end to end in quick mode. Benchmarks are not tests: this proves
the harness works and leaves its files, and asserts no timing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import orjson

from pending_actions.procs import ROOT
from pending_actions_harness.bench import throughput

# Every row of a quick run (depth and session points are 1 and 1,000 there).
QUICK_ROWS = [
    "redis.ping.p50", "redis.evalsha.p50", "redis.ping.idle.p50", "redis.evalsha.idle.p50",
    "resolve.idle.p50", "resolve.idle.everysec.p50", "resolve.idle.p50.rabbitmq",
    "resolve.idle.p50.floor", "floor.idle.p50", "floor.idle.everysec.p50", "floor.idle.noaof.p50",
    "resolve.idle.p99", "resolve.idle.p99.rabbitmq",
    "resolve.loaded.throughput", "resolve.loaded.throughput.rabbitmq",
    "resolve.loaded.p50", "resolve.loaded.p99",
    "stage.pipelined", "stage.single",
    "memory.1_per_session", "memory.10_per_session", "memory.one_session",
    "memory.1_per_session_ttl",
    "depth.1.p50", "depth.1000.p50", "depth.1000.p99",
    "sessions.1.p50", "sessions.1000.p50", "sessions.1000.p99",
    "idle.commands", "commands.per_resolve", "redis_cpu.per_resolve",
    "roundtrips.per_resolve",
    "scaling.p1.throughput", "scaling.p1.p50", "scaling.p2.throughput", "scaling.p2.p50",
    "scaling.p4.throughput", "scaling.p4.p50", "scaling.p4r2.throughput", "scaling.p4r2.p50",
    "scaling.pairs.throughput", "resolve.idle.noaof.p50.rabbitmq",
    "peer.stage.p50", "peer.idle.p50", "peer.idle.everysec.p50", "peer.loaded.throughput",
    "peer.bytes",
    "cluster.commands.per_resolve", "cluster.spread", "cluster.idle.p50",
    "cluster.loaded.throughput", "cluster.loaded.p50",
    "policy.stage.p50", "policy.glob.worst", "tracing.idle.p50", "tracing.handler.unsampled",
    "tracing.handler.sampled", "tracing.loaded.sampled", "mcp.read.p50",
    "mcp.resolve.p50",
]
# rows of an optional part a run may skip (saying why in the row's note): the key's start
OPTIONAL = {"peer.": "langgraph", "tracing.": "tracing", "mcp.": "mcp"}


def test_bench_quick_writes_table_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "pending_actions_harness.bench", "--quick", "--no-progress",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=360, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    doc = orjson.loads((out / "results.json").read_bytes())
    rows = {row["key"]: row for row in doc["rows"]}
    assert [k for k in QUICK_ROWS if k not in rows] == []
    rabbit_skipped = "rabbitmq" in doc["skipped"]
    for key, row in rows.items():
        if (key.endswith(".rabbitmq") and rabbit_skipped) or any(
                key.startswith(start) and part in doc["skipped"]
                for start, part in OPTIONAL.items()):
            assert row["note"], key  # a skipped baseline says why
            continue
        assert row["value"] is not None, key
        if key != "redis.ping.p50":  # the one figure that is itself the floor
            assert row["baseline_value"] is not None, key
    for name in ("ours.idle", "ours.loaded", "stock.redis.idle", "stock.redis.loaded",
                 "scaling.stock.p1", "scaling.stock.p2", "scaling.stock.p4", "scaling.ours.p1",
                 "scaling.ours.p2", "scaling.ours.p4", "scaling.ours.p4r2",
                 "floor.idle", "floor.idle.everysec", "floor.idle.noaof"):
        assert doc["distributions"][name]["n"] > 0, name
        assert doc["distributions"][name]["errors"] == 0, name

    facts = doc["facts"]
    if "langgraph" in doc["skipped"]:  # the peer's packages or its PostgreSQL are not here
        assert f"skipped langgraph: {doc['skipped']['langgraph']}" in proc.stdout
    else:
        for name in ("langgraph.stage", "langgraph.idle", "langgraph.loaded.threads",
                     "langgraph.loaded.processes", "ours.loaded.peer", "ours.idle.noaof"):
            assert doc["distributions"][name]["n"] > 0, name
            assert doc["distributions"][name]["errors"] == 0, name
        assert facts["langgraph"]["bytes_per_action"]["per_action"] > 0
        assert facts["langgraph"]["loaded_best"] in ("threads", "processes")
    # the features' figures: both tenants' stages, every glob missed its string (it raises
    # otherwise), spans really sent while tracing, every MCP call answered
    assert len(facts["policy"]["block_ratios"]) == 3
    assert facts["policy"]["blocks_p50_ms"]["ruled"]
    assert len(facts["globs"]["globs"]) == 10
    if "tracing" not in doc["skipped"]:
        assert facts["tracing"]["exports"] > 0
        assert doc["distributions"]["tracing.idle"]["errors"] == 0
    if "mcp" not in doc["skipped"]:
        for name in ("mcp.read.direct", "mcp.read.proxied", "mcp.resolve"):
            assert doc["distributions"][name]["n"] > 0, name
    # every one-process pair was run, and its ratio is its own two sides'
    pairs = facts["scaling"]["pairs"]["pairs"]
    assert len(pairs) == throughput.PAIRS
    for pair in pairs:
        assert pair["ratio"] == pair["ours"] / pair["stock"]
    for cost in (facts["per_resolve.ours"], facts["per_message.stock.redis"]):
        assert cost["commands"] > cost["reads"] > 0
        assert cost["by_command"]  # what a resolve (a message) costs, command by command
    # every step of every traced idle resolve was found in the MONITOR feed
    breakdown = facts["idle_breakdown"]
    assert breakdown["resolves"] == doc["meta"]["sizes"]["traced"]
    for step, figures in breakdown["steps"].items():
        assert figures["n"] == breakdown["resolves"], step
        assert figures["median_ms"] > 0, step
    assert "Idle resolve step by step" in proc.stdout

    if importlib.util.find_spec("matplotlib") is not None:
        assert doc["plot"] == "latency.png"
        assert (out / "latency.png").read_bytes().startswith(b"\x89PNG")
    else:
        assert doc["plot"] is None
        assert "no plot: matplotlib is not installed" in proc.stderr

    for figure in ("resolve idle p50", "stage, one producer pipelined", "ratio"):
        assert figure in proc.stdout
