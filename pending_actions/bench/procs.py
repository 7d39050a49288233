"""The processes a run starts: workers of ours and of stock dramatiq, each a real process tree
in its own process group, waited for through events they publish rather than by sleeping, and
always stopped (SIGTERM, then SIGKILL of the group) by whoever started them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import redis

from pending_actions.bench.stock import ENV_BROKER, ENV_QUEUE, ENV_READY, ENV_RESULTS
from pending_actions.supervise import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment without knobs that would change what is measured: every
    worker runs with default settings unless the harness says otherwise."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PENDING_ACTIONS_", "dramatiq_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@dataclass
class Child:
    """One started command with its own process group (so its whole tree can be stopped)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def spawn(self) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log = (self.log_dir / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self.proc

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see "
                               f"{self.log_dir / (self.name + '.log')}")

    def stop(self, timeout: float = 20.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # lets both CLIs shut their children down in order
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        # Anything of this group still there (a stuck child, or the leader itself) is ours.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if self._log is not None:
            self._log.close()
        self.proc = None


def start_ours(url: str, processes: int, threads: int, log_dir: Path,
               timeout: float = 60.0) -> tuple[WorkerProcess, list[int]]:
    """``pending-actions worker --handlers pending_actions.bench.handlers``: a resolve worker
    (the CLI process)
    plus ``processes`` dramatiq worker processes. Returns the worker and every pid that holds
    Redis connections (the resolver and each dramatiq worker process)."""
    worker = WorkerProcess(
        url, "pending_actions.bench.handlers",
        {"worker_processes": str(processes), "worker_threads": str(threads)},
        env=child_env({}), log_path=log_dir / "ours-worker.log")
    try:
        worker.start(timeout)
    except BaseException:
        if worker.proc is not None:
            worker.stop()
        raise
    assert worker.proc is not None
    return worker, [worker.proc.pid, *worker.dramatiq_pids]


def start_stock(broker_url: str, results_url: str, queue: str, processes: int, threads: int,
                log_dir: Path, name: str, timeout: float = 60.0) -> tuple[Child, list[int]]:
    """``python -m dramatiq pending_actions.bench.stock_actors`` with the given broker; returns
    the child and
    the pids of its worker processes once each has booted."""
    ready_key = f"bench:ready:{uuid.uuid4().hex}"
    child = Child(name, [
        sys.executable, "-m", "dramatiq", "pending_actions.bench.stock_actors",
        "--processes", str(processes), "--threads", str(threads), "--path", str(ROOT),
    ], child_env({ENV_BROKER: broker_url, ENV_QUEUE: queue, ENV_RESULTS: results_url,
               ENV_READY: ready_key}),
        log_dir)
    child.spawn()
    client = redis.Redis.from_url(results_url)
    pids: list[int] = []
    deadline = time.monotonic() + timeout
    try:
        while len(pids) < processes:
            child.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not become ready")
            got: Any = client.blpop([ready_key], timeout=1)
            if got is not None:
                pids.append(int(got[1]))
    except BaseException:
        child.stop()
        raise
    finally:
        client.delete(ready_key)
        client.close()
    return child, pids
