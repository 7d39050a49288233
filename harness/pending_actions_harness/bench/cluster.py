"""The same resolves on a private 3-master Redis Cluster, beside the single-Redis figures of
the same run: idle latency, loaded throughput, Redis commands per resolve, and how evenly the
commands spread over the masters with 1,000 sessions (INFO commandstats of each master)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import redis

from pending_actions.producers import PendingActions
from pending_actions_harness.bench import fill, measure
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.procs import start_ours
from pending_actions_harness.bench.progress import Progress
from pending_actions_harness.embedded_cluster import Cluster

SESSIONS = 1000


def calls(client: redis.Redis) -> int:
    """Commands a server has run since its last CONFIG RESETSTAT, INFO itself not counted."""
    stats: Any = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def run(r: Any, logs: Path, progress: Progress) -> None:
    s, o = r.sizes, r.options
    with tempfile.TemporaryDirectory(prefix="pa-bench-cluster-") as data:
        with progress.phase("cluster: start 3 masters", 1) as tick:
            cluster = Cluster(Path(data), masters=3, fsync=o.fsync).start()
            tick(1)
        try:
            ours = start_ours(cluster.url, o.processes, o.threads, logs / "cluster")
            try:
                _figures(r, cluster, s, progress)
                ours.check_alive()
            finally:
                ours.stop()
        finally:
            cluster.stop()


def _figures(r: Any, cluster: Cluster, s: Any, progress: Progress) -> None:
    pa = PendingActions.from_url(cluster.url)
    masters = [cluster.node(p).client() for p in cluster.master_ports()]
    try:
        payload = fill.payload_of(s.payload_bytes)

        def stage(session: str) -> None:
            pa.stage(session=session, tool="bench", label="bench action", apply=NOOP,
                     payload=payload)

        for _ in range(3):  # connections and scripts on every master
            stage("bench-idle")
            measure.resolver(pa, "bench-idle")()
        with progress.phase("cluster: idle resolve", s.idle) as tick:
            r.dists["cluster.idle"] = measure.idle(
                "cluster idle", measure.resolver(pa, "bench-idle"), s.idle, s.idle_gap_s, tick,
                before=lambda: stage("bench-idle"))
        names = [f"bench-spread-{i}" for i in range(SESSIONS)]
        per_caller = max(s.per_caller, SESSIONS // s.callers)
        total = s.callers * per_caller
        with progress.phase(f"cluster: {SESSIONS:,} sessions, {s.callers} callers",
                            total * 2) as tick:
            fill.stage_bulk(pa, fill.cycle(names, total // SESSIONS + 1),
                            SESSIONS * (total // SESSIONS + 1), payload, 1000, tick)
            for m in masters:
                m.config_resetstat()
            # caller i resolves sessions i, i + callers, ...: every session, evenly
            calls_ = [_cycling(pa, names[i::s.callers]) for i in range(s.callers)]
            r.dists["cluster.loaded"] = measure.loaded("cluster loaded", calls_, per_caller,
                                                       tick)
            per_node = [calls(m) for m in masters]
        mean = sum(per_node) / len(per_node)
        r.facts["cluster.spread"] = {
            "masters": cluster.master_ports(), "sessions": SESSIONS, "resolves": total,
            "commands_per_node": per_node, "max_over_mean": max(per_node) / mean,
            "commands_per_resolve": sum(per_node) / total}
    finally:
        pa.close()
        for m in masters:
            m.close()


def _cycling(pa: PendingActions, sessions: list[str]) -> measure.Call:
    state = {"i": 0}

    def call() -> float:
        session = sessions[state["i"] % len(sessions)]
        state["i"] += 1
        return measure.resolver(pa, session)()

    return call
