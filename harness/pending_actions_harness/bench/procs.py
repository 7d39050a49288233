"""The workers a run measures, ours and stock dramatiq's, started alike through
``pending_actions.procs`` (each a process group in our session, default settings, a log file
under the run's directory) and awaited through the ready events they publish."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from pending_actions.broker.keys import Keys
from pending_actions.procs import ROOT, Child, StreamWatch, await_ready, child_env
from pending_actions_harness.bench.stock import ENV_BROKER, ENV_QUEUE, ENV_READY, ENV_RESULTS
from pending_actions_harness.supervise import WorkerProcess


@dataclass
class Ours:
    """``pending-actions worker`` processes: each a resolve worker (the CLI process) with its
    own dramatiq worker processes beside it."""

    workers: list[WorkerProcess]

    @property
    def pids(self) -> list[int]:
        """Every pid that holds Redis connections: each resolver and dramatiq process."""
        return [p for w in self.workers for p in (w.pid, *w.dramatiq_pids)]

    def check_alive(self) -> None:
        for w in self.workers:
            w.check_alive()

    def kill(self) -> None:
        """SIGKILL every worker's whole tree (each a child of ours, by its pid)."""
        for w in self.workers:
            w.kill()

    def stop(self) -> None:
        for w in self.workers:  # all at once: each may wait out a blocking read
            w.terminate()
        for w in self.workers:
            w.stop()


def start_ours(url: str, processes: int, threads: int, log_dir: Path, resolvers: int = 1,
               timeout: float = 60.0, settings: dict[str, str] | None = None,
               env: dict[str, str] | None = None) -> Ours:
    """``pending-actions worker --handlers pending_actions_harness.bench.handlers``,
    ``resolvers`` of them, with ``processes`` dramatiq worker processes shared out between them
    (the one way to run a second resolve worker: the CLI has no resolve-only or dramatiq-only
    mode). ``env``: more environment for each (``OTEL_*``, say)."""
    if processes % resolvers:
        raise ValueError(f"{processes} dramatiq processes cannot be shared by {resolvers}")
    each = {"worker_processes": str(processes // resolvers), "worker_threads": str(threads),
            **(settings or {})}
    names = ["ours-worker"] if resolvers == 1 else [
        f"ours-worker-{i + 1}-of-{resolvers}" for i in range(resolvers)]
    workers = [WorkerProcess(url, "pending_actions_harness.bench.handlers", each, env,
                             log_path=log_dir / f"{name}.log") for name in names]
    # every watch opened before any launch: no ready event can be missed
    watches = [StreamWatch(url, Keys().workers) for _ in workers]
    try:
        for w in workers:
            w.launch()
        for w, watch in zip(workers, watches, strict=True):
            w.wait_ready(timeout=timeout, watch=watch)
    except BaseException:
        for w in workers:
            w.kill()
        raise
    finally:
        for watch in watches:
            watch.close()
    return Ours(workers)


def start_stock(broker_url: str, results_url: str, queue: str, processes: int, threads: int,
                log_dir: Path, name: str, timeout: float = 60.0) -> tuple[Child, list[int]]:
    """``python -m dramatiq pending_actions_harness.bench.stock_actors`` with the given broker;
    returns the child and the pids of its worker processes once each has booted."""
    ready_stream = f"bench:ready:{uuid.uuid4().hex}"
    watch = StreamWatch(results_url, ready_stream, b"0-0")
    child = Child(name, [
        sys.executable, "-m", "dramatiq", "pending_actions_harness.bench.stock_actors",
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
