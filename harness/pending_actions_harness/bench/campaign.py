"""One run of a campaign that compares settings run after run (dispatch_ab, tracing_cost): a
fresh Redis and ``pending-actions worker``, idle resolves under ``appendfsync always`` and
``everysec``, then many callers loaded, each figure a median of that run alone."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions_harness.bench import fill, measure
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.procs import start_ours
from pending_actions_harness.bench.progress import Progress


def fresh_run(mode: str, prefix: str, *, processes: int, settings: dict[str, str] | None,
              idle: int, gaps_s: tuple[float, float], callers: int,
              per_caller: int) -> dict[str, Any]:
    """The run's idle p50s, loaded throughput and p50, and its failed round trips; sessions
    are named ``<prefix>-...`` (one run's Redis is its own, so only the logs tell them)."""
    quiet = Progress(0, enabled=False)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(directory=Path(tmp) / "redis").start()
        ours = start_ours(server.url, processes, 8, Path(tmp), settings=settings)
        pa = PendingActions.from_url(server.url)
        try:
            payload = fill.payload_of(256)
            head = f"{prefix}-idle"

            def stage() -> None:
                pa.stage(session=head, tool="bench", label="bench action", apply=NOOP,
                         payload=payload)

            always, everysec = measure.idle_resolves(
                pa, mode, stage, measure.resolver(pa, head), idle, gaps_s, quiet)
            names = [f"{prefix}-{i}" for i in range(callers)]
            # two more each than are timed: the warm-up's
            each = per_caller + 2
            fill.stage_bulk(pa, fill.cycle(names, each), callers * each, payload, 1000,
                            lambda n: None)
            calls = [measure.resolver(pa, n) for n in names]
            measure.loaded("warm-up", calls, 2, lambda n: None)
            loaded = measure.loaded(mode, calls, per_caller, lambda n: None)
            ours.check_alive()
        finally:
            pa.close()
            ours.kill()
            server.kill()
    return {"idle_p50_ms": always.p50, "idle_everysec_p50_ms": everysec.p50,
            "loaded_per_s": loaded.throughput, "loaded_p50_ms": loaded.p50,
            "errors": always.errors + everysec.errors + loaded.errors}
