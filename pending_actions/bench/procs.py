"""The workers a run measures, ours and stock dramatiq's, started alike through
``pending_actions.procs`` (each a process group in our session, default settings, a log file
under the run's directory) and awaited through the ready events they publish."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from pending_actions.bench.stock import ENV_BROKER, ENV_QUEUE, ENV_READY, ENV_RESULTS
from pending_actions.procs import ROOT, Child, StreamWatch, await_ready, child_env
from pending_actions.supervise import WorkerProcess


def start_ours(url: str, processes: int, threads: int, log_dir: Path,
               timeout: float = 60.0) -> tuple[WorkerProcess, list[int]]:
    """``pending-actions worker --handlers pending_actions.bench.handlers``: a resolve worker
    (the CLI process) plus ``processes`` dramatiq worker processes. Returns the worker and every
    pid that holds Redis connections (the resolver and each dramatiq worker process)."""
    worker = WorkerProcess(
        url, "pending_actions.bench.handlers",
        {"worker_processes": str(processes), "worker_threads": str(threads)},
        log_path=log_dir / "ours-worker.log").start(timeout)
    return worker, [worker.pid, *worker.dramatiq_pids]


def start_stock(broker_url: str, results_url: str, queue: str, processes: int, threads: int,
                log_dir: Path, name: str, timeout: float = 60.0) -> tuple[Child, list[int]]:
    """``python -m dramatiq pending_actions.bench.stock_actors`` with the given broker; returns
    the child and the pids of its worker processes once each has booted."""
    ready_stream = f"bench:ready:{uuid.uuid4().hex}"
    watch = StreamWatch(results_url, ready_stream, b"0-0")
    child = Child(name, [
        sys.executable, "-m", "dramatiq", "pending_actions.bench.stock_actors",
        "--processes", str(processes), "--threads", str(threads), "--path", str(ROOT),
    ], env=child_env({ENV_BROKER: broker_url, ENV_QUEUE: queue, ENV_RESULTS: results_url,
                      ENV_READY: ready_stream}),
        cwd=ROOT, log_path=log_dir / f"{name}.log").spawn()
    pids: list[int] = []

    def ready(seconds: float) -> bool:
        pids.extend(int(fields[b"pid"]) for fields in watch.read(seconds))
        return len(pids) >= processes

    try:
        await_ready(child, ready, timeout)
    finally:
        watch.client.delete(ready_stream)
        watch.close()
    return child, pids
