"""Child processes, started, awaited and stopped one way, by `up`, `worker`, soak, the benchmark
and the tests alike.

- Spawn: every child gets its own process group, so that a terminal's Ctrl-C reaches only us
  and whoever started it can stop its whole tree. (A group, not a session: a new session is a
  new scheduler autogroup, measured to cost a loaded worker a fifth of its throughput.) Stdin
  is /dev/null; output goes to a log file or to ours. A child started from the main thread gets
  SIGTERM from the kernel when we die, however we die (Linux ``PR_SET_PDEATHSIG``; the kernel
  ties it to the spawning *thread*, so children of other threads cannot have it).
- Readiness: the child publishes an event (an entry on a Redis stream, or for redis-server its
  first answer); ``await_ready`` waits on it in bounded blocks and fails as soon as the child
  exits or the deadline passes, killing the child: a child that never got ready must not
  outlive its caller.
- Shutdown: exactly one SIGTERM (dramatiq takes a second one as "kill now"), a bounded wait,
  then SIGKILL of the child's group and of every descendant, whatever group it is in.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

# The checkout (or site-packages): children run there, with it on their path, so that they
# import this very tree and the tests' handler modules.
ROOT = Path(__file__).resolve().parent.parent

_PR_SET_PDEATHSIG = 1
_SIGTERM = int(signal.SIGTERM)
# Resolved before any fork: the child between fork and exec must not load anything.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)


class ChildExited(RuntimeError):
    """A child ended while we were waiting for it to get ready."""

    def __init__(self, child: Child) -> None:
        self.child = child
        where = f"; see {child.log_path}" if child.log_path else ""
        super().__init__(f"{child.name} exited with {child.returncode}{where}")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment without the knobs that would change a child's behaviour
    (``PENDING_ACTIONS_*``, ``dramatiq_*``), with ROOT on the path, plus ``extra``: the child runs
    with default settings unless the caller says otherwise."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PENDING_ACTIONS_", "dramatiq_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _die_with(parent: int) -> None:
    """Runs in the child between fork and exec."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, _SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above: nobody would tell us
        os._exit(1)


@dataclass
class Child:
    """One command in its own process group."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None  # None: ours
    cwd: Path | None = None  # None: ours
    log_path: Path | None = None  # None: the child writes to our stdout and stderr
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _terminated: bool = field(default=False, repr=False)

    def spawn(self) -> Child:
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = self.log_path.open("ab")
        bound = threading.current_thread() is threading.main_thread()
        parent = os.getpid()
        try:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=None if log is None else subprocess.STDOUT, process_group=0,
                preexec_fn=(lambda: _die_with(parent)) if bound else None)
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        self._terminated = False
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, seconds: float) -> int | None:
        """Wait at most ``seconds`` for the child to exit; its exit code, or None if it
        still runs."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(seconds)
        return self.proc.poll()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ChildExited(self)

    def tree(self) -> list[int]:
        """The child and all its descendants."""
        return descendants(self.pid) if self.running() else []

    def terminate(self) -> None:
        """The one SIGTERM: the child's own orderly shutdown."""
        if self.running() and not self._terminated:
            self._terminated = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (unless already sent), wait up to ``timeout``, then SIGKILL what is left."""
        if self.proc is None:
            return None
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the child's group and every descendant at once, as a crash would."""
        if self.proc is None:
            return
        targets = self.tree()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in targets:
            kill_pid(pid)
        self.proc.wait()


def kill_pid(pid: int) -> None:
    """SIGKILL one process, if it is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, found through /proc."""
    tree = [pid]
    for p in tree:
        tree.extend(children(p))
    return tree


def children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    out: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError):
            out.extend(int(x) for x in (task / "children").read_text().split())
    return out


def await_ready(child: Child, ready: Callable[[float], bool], timeout: float) -> None:
    """The one readiness protocol. ``ready(seconds)`` waits at most that long for the event the
    child publishes and says whether the child is ready; between calls, a child that exited or
    a passed deadline fails the start. On any failure the child is killed."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            child.check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{child.name} did not become ready within {timeout:.0f}s")
            if ready(min(left, 1.0)):
                return
    except BaseException:
        child.kill()
        raise


class StreamWatch:
    """The entries added to a Redis stream after a point (by default: after now, so create it
    before starting the child that will write them)."""

    def __init__(self, url: str, stream: str, since: bytes | None = None) -> None:
        self.client = redis.Redis.from_url(url)
        self.stream = stream
        if since is None:
            last: Any = self.client.xrevrange(stream, count=1)  # redis-py types replies as unions
            since = last[0][0] if last else b"0-0"
        self.since: bytes = since

    def read(self, seconds: float) -> list[dict[bytes, bytes]]:
        """The next entries, waiting at most ``seconds`` for one."""
        got: Any = self.client.xread({self.stream: self.since}, block=max(1, int(seconds * 1000)))
        out: list[dict[bytes, bytes]] = []
        for _s, entries in got or ():
            for entry_id, fields in entries:
                self.since = entry_id
                out.append(fields)
        return out

    def close(self) -> None:
        self.client.close()


class ExitWatch:
    """Awaits the exits of processes that need not be our children (pidfds: no polling, and no
    confusion with a later process that reuses a pid, since each is opened up front)."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.fds: dict[int, int] = {}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # already gone
                self.fds[os.pidfd_open(pid)] = pid

    def wait(self, timeout: float) -> list[int]:
        """Wait until all have exited; the pids still running at the deadline."""
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        running = set(self.fds)
        deadline = time.monotonic() + timeout
        while running and (left := deadline - time.monotonic()) > 0:
            for fd, _event in poller.poll(left * 1000):
                poller.unregister(fd)
                running.discard(fd)
        return sorted(self.fds[fd] for fd in running)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = {}

    def __enter__(self) -> ExitWatch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
