"""Worker processes started and killed from outside, for the soak command and the tests:
``pending-actions worker`` as a child, readiness awaited on the ``workers`` event stream."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pending_actions.broker.connection import producer_client
from pending_actions.broker.keys import Keys

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcess:
    def __init__(self, url: str, handlers: str, overrides: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.url = url
        self.handlers = handlers
        self.overrides = overrides or {}
        self.extra_env = env or {}
        self.log_path = log_path  # None: the child writes to our stdout/stderr
        self.proc: subprocess.Popen[bytes] | None = None
        self.dramatiq_pids: list[int] = []

    def environment(self) -> dict[str, str]:
        """Our environment without the knobs that would change the worker's behaviour; only
        what the caller passes is set."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PENDING_ACTIONS_", "dramatiq_"))}
        env["PENDING_ACTIONS_REDIS_URL"] = self.url
        env.update(self.extra_env)
        env.update({f"PENDING_ACTIONS_{k.upper()}": v for k, v in self.overrides.items()})
        return env

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        client: Any = producer_client(self.url)
        last = client.xrevrange(Keys().workers, count=1)
        client.close()
        self.launch()
        try:
            return self.wait_ready(last[0][0] if last else b"0-0", timeout)
        except BaseException:
            self.kill()  # a worker that never got ready must not outlive its caller
            raise

    def launch(self) -> WorkerProcess:
        """Start the process without waiting (it may have no Redis to talk to yet)."""
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pending_actions", "worker", "--handlers", self.handlers],
                env=self.environment(), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                stderr=None if log is None else subprocess.STDOUT,
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        return self

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            where = f"; see {self.log_path}" if self.log_path else ""
            raise RuntimeError(f"worker exited with {self.proc.returncode}{where}")

    def wait_ready(self, since: bytes = b"0-0", timeout: float = 30.0) -> WorkerProcess:
        """Block on the ``workers`` stream until this worker's resolver and dramatiq
        processes have said they are ready."""
        assert self.proc is not None
        client: Any = producer_client(self.url)
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
                    elif role == b"dramatiq" and fields.get(b"event") == b"ready" and \
                            pid in self.tree():
                        self.dramatiq_pids.append(pid)
        client.close()
        return self

    def tree(self) -> list[int]:
        """This worker's process and all its descendants."""
        if self.proc is None:
            return []
        tree = [self.proc.pid]
        for pid in tree:
            tree.extend(_children(pid))
        return tree

    def kill(self) -> None:
        """SIGKILL the whole worker: CLI process, dramatiq master and its children, at once."""
        if self.proc is None:
            return
        for pid in self.tree():
            _kill(pid)
        self.proc.wait()

    def kill_one_handler_process(self) -> bool:
        """SIGKILL one dramatiq worker process (the runner restarts dramatiq)."""
        leaves = [p for p in self.tree()[1:] if not _children(p)]
        if not leaves:
            return False
        _kill(leaves[0])
        return True

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
