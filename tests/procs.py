"""Real processes for the tests: a worker (resolve worker + dramatiq) started through the CLI,
waited for through the ``workers`` event stream rather than by sleeping."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from broker.keys import Keys

ROOT = Path(__file__).resolve().parent.parent


def runs_key(session: str) -> str:
    """Where tests.handlers records every handler run of a session."""
    return f"test:runs:{session}"


def worker_env(url: str, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PENDING_ACTIONS_")}
    env.update({"PENDING_ACTIONS_REDIS_URL": url, "PYTHONPATH": str(ROOT),
                "PENDING_ACTIONS_WORKER_THREADS": "8", "PENDING_ACTIONS_BLOCK_MS": "1000",
                "dramatiq_worker_timeout": "200", "dramatiq_restart_delay": "100"})
    env.update({f"PENDING_ACTIONS_{k.upper()}": v for k, v in overrides.items()})
    return env


@dataclass
class Worker:
    url: str
    handlers: str = "tests.handlers"
    overrides: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    dramatiq_pids: list[int] = field(default_factory=list)

    def start(self, timeout: float = 30.0) -> Worker:
        client = redis.Redis.from_url(self.url)
        last = client.xrevrange(Keys().workers, count=1)
        client.close()
        return self.launch().wait_ready(last[0][0] if last else b"0-0", timeout)

    def launch(self) -> Worker:
        """Start the process without waiting (it may have no Redis to talk to yet)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pending_actions", "worker", "--handlers", self.handlers],
            env=worker_env(self.url, **self.overrides), cwd=ROOT,
        )
        return self

    def wait_ready(self, since: bytes = b"0-0", timeout: float = 30.0) -> Worker:
        """Block on the ``workers`` stream until this worker's resolver and dramatiq
        processes have said they are ready."""
        assert self.proc is not None
        client = redis.Redis.from_url(self.url)
        stream = Keys().workers
        processes = int(self.overrides.get("worker_processes", "1"))
        resolver_ready = False
        self.dramatiq_pids = []
        deadline = time.monotonic() + timeout
        while not (resolver_ready and len(self.dramatiq_pids) >= processes):
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("worker did not become ready")
            got = client.xread({stream: since}, block=int(min(left, 1.0) * 1000))
            for _s, entries in got or ():
                for entry_id, fields in entries:
                    since = entry_id
                    role, pid = fields[b"role"], int(fields[b"pid"])
                    if role == b"resolver" and pid == self.proc.pid:
                        resolver_ready = True
                    elif role == b"dramatiq" and self._is_mine(pid):
                        self.dramatiq_pids.append(pid)
        client.close()
        return self

    def _is_mine(self, pid: int) -> bool:
        """dramatiq's worker processes are grandchildren of our CLI process."""
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            grand = int(Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        return self.proc is not None and grand == self.proc.pid

    def kill(self) -> None:
        """SIGKILL the whole worker: CLI process, dramatiq master and its children, at once."""
        if self.proc is None:
            return
        tree = [self.proc.pid]
        for pid in tree:
            tree.extend(_children(pid))
        for pid in tree:
            _kill(pid)
        self.proc.wait()

    def stop(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def _children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    out: list[int] = []
    for task in tasks:
        try:
            out.extend(int(x) for x in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
