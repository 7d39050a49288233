"""``pending-actions worker`` as a child process, for soak, the benchmark and the tests: started
through ``procs``, ready once its resolver and each dramatiq process have said so on the
``workers`` stream, and killed from outside as a crash would."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Self

from pending_actions.broker.keys import Keys
from pending_actions.procs import (
    ROOT,
    Child,
    StreamWatch,
    await_ready,
    child_env,
    children,
    kill_pid,
)


class WorkerProcess:
    def __init__(self, url: str, handlers: str, overrides: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.url = url
        self.handlers = handlers
        self.overrides = overrides or {}
        self.extra_env = env or {}
        self.child = Child("worker", [sys.executable, "-m", "pending_actions", "worker",
                                      "--handlers", handlers],
                           env=self.environment(), cwd=ROOT, log_path=log_path)
        self.dramatiq_pids: list[int] = []

    @property
    def pid(self) -> int:
        return self.child.pid

    def environment(self) -> dict[str, str]:
        """Default settings but for what the caller passes."""
        return child_env({"PENDING_ACTIONS_REDIS_URL": self.url, **self.extra_env,
                          **{f"PENDING_ACTIONS_{k.upper()}": v
                             for k, v in self.overrides.items()}})

    def start(self, timeout: float = 30.0) -> Self:
        watch = StreamWatch(self.url, Keys().workers)
        self.launch()
        return self.wait_ready(timeout=timeout, watch=watch)

    def launch(self) -> Self:
        """Start the process without waiting (it may have no Redis to talk to yet)."""
        self.child.spawn()
        return self

    def check_alive(self) -> None:
        self.child.check_alive()

    def wait_ready(self, since: bytes = b"0-0", timeout: float = 30.0,
                   watch: StreamWatch | None = None) -> Self:
        """Until this worker's resolver and each of its dramatiq processes has said it is
        ready on the ``workers`` stream (entries after ``since``)."""
        watch = watch or StreamWatch(self.url, Keys().workers, since)
        processes = int(self.overrides.get("worker_processes", "1"))
        resolver_ready = False
        self.dramatiq_pids = []

        def ready(seconds: float) -> bool:
            nonlocal resolver_ready
            for fields in watch.read(seconds):
                role, pid = fields[b"role"], int(fields[b"pid"])
                if role == b"resolver" and pid == self.child.pid:
                    resolver_ready = True
                elif role == b"dramatiq" and fields.get(b"event") == b"ready" and \
                        pid in self.child.tree():
                    self.dramatiq_pids.append(pid)
            return resolver_ready and len(self.dramatiq_pids) >= processes

        try:
            await_ready(self.child, ready, timeout)
        finally:
            watch.close()
        return self

    def tree(self) -> list[int]:
        """This worker's process and all its descendants."""
        return self.child.tree()

    def kill(self) -> None:
        """SIGKILL the whole worker: CLI process, dramatiq master and its children, at once."""
        self.child.kill()

    def kill_one_handler_process(self) -> bool:
        """SIGKILL one dramatiq worker process (the runner restarts dramatiq)."""
        leaves = [p for p in self.tree()[1:] if not children(p)]
        if not leaves:
            return False
        kill_pid(leaves[0])
        return True

    def terminate(self) -> None:
        """The SIGTERM a service manager sends."""
        self.child.terminate()

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it has exited (None if it still runs after ``timeout``)."""
        return self.child.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM: the worker stops in order (see ``runner``); SIGKILL after ``timeout``."""
        return self.child.stop(timeout)
