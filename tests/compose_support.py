"""Docker for tests/test_compose.py: a private dockerd (its own data root and socket, no bridge,
no iptables: every container uses the host's network), the stand-in base images of
.ci/docker-standins.sh, and docker-compose driven for one project.

The daemon's data root outlives the test (``PA_DOCKER_STATE``, default
/var/tmp/pending-actions-docker), so images built once are reused by the next run. Set
``PA_DOCKER_HOST`` to use a daemon you already run instead (it must be able to pull or already
hold the images that Dockerfile and docker-compose.yml name)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("PA_DOCKER_STATE", "/var/tmp/pending-actions-docker"))
STANDINS = ROOT / ".ci" / "docker-standins.sh"


def compose_command() -> list[str] | None:
    """docker-compose (1.29 and newer) or the `docker compose` plugin, whichever is here."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    return None


def unavailable() -> str | None:
    """Why Docker cannot run the compose test here, or None if it can."""
    if not shutil.which("docker"):
        return "no docker client (apt-get install docker.io)"
    if compose_command() is None:
        return "no docker-compose (apt-get install docker-compose)"
    if os.environ.get("PA_DOCKER_HOST"):
        return None
    if os.geteuid() != 0:
        return "a private dockerd needs root (or set PA_DOCKER_HOST to a running daemon)"
    missing = [b for b in ("dockerd", "debootstrap") if not shutil.which(b)]
    if missing:
        return f"no {' or '.join(missing)} (apt-get install docker.io debootstrap)"
    return None


class Dockerd:
    """A dockerd of our own, or the one PA_DOCKER_HOST names. One test run at a time holds the
    state folder (a lock), since two daemons cannot share a data root."""

    def __init__(self, state: Path = STATE) -> None:
        self.state = state
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        given = os.environ.get("PA_DOCKER_HOST")
        self.host = given or f"unix://{state / 'docker.sock'}"
        self.own = not given

    def env(self) -> dict[str, str]:
        # the classic builder: the docker CLI here may have no buildx plugin
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0",
                "COMPOSE_DOCKER_CLI_BUILD": "0"}

    def ping(self) -> bool:
        return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              env=self.env(), capture_output=True, timeout=30,
                              check=False).returncode == 0

    def start(self, timeout: float = 60) -> Dockerd:
        if not self.own:
            if not self.ping():
                raise RuntimeError(f"no Docker daemon answers at PA_DOCKER_HOST={self.host}")
            return self
        self.state.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.state / "lock", "w")  # noqa: SIM115 - held until stop()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        if self.ping():  # left running by a run that died: use it, leave it running
            return self
        log = open(self.state / "dockerd.log", "ab")  # noqa: SIM115 - the daemon's own
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.state / "data"),
             "--exec-root", str(self.state / "exec"), "--pidfile", str(self.state / "pid"),
             "--host", self.host, "--bridge=none", "--iptables=false", "--ip6tables=false",
             "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        # the socket answering is the event; dockerd offers no other way to wait for it
        proc = self.proc
        assert proc is not None

        def answering() -> bool:
            assert proc.poll() is None, f"dockerd exited with {proc.returncode}"
            return self.ping()

        try:
            wait_until(answering, timeout, "dockerd answering", interval_s=0.2)
        except AssertionError as failed:
            self.stop()
            tail = (self.state / "dockerd.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"dockerd did not start ({failed}):\n{tail}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # stops its containers and containerd
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            # dockerd leaves its handle on the host's network namespace mounted
            netns = self.state / "exec" / "netns" / "default"
            if os.path.ismount(netns):
                subprocess.run(["umount", str(netns)], check=False)
        self.proc = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def standins(self) -> None:
        """Build the base images that are missing (nothing when all are there)."""
        if self.own:
            subprocess.run([str(STANDINS)], env=self.env(), check=True, timeout=1200)

    def disk_usage(self) -> int:
        """Bytes under the data root."""
        total = 0
        for path, _dirs, files in os.walk(self.state / "data"):
            for name in files:
                with suppress(OSError):  # gone while we walked
                    total += os.lstat(os.path.join(path, name)).st_size
        return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Compose:
    """docker-compose on the repo's own files, unchanged, as one project: docker-compose.yml,
    and after it the overrides ``files`` names (docker-compose.bridge.yml). Its ports are free
    ones of this machine."""

    def __init__(self, daemon: Dockerd, project: str, redis_port: int,
                 files: tuple[str, ...] = ()) -> None:
        command = compose_command()
        assert command is not None
        self.daemon = daemon
        self.command = [*command, "-p", project,
                        *(a for f in ("docker-compose.yml", *files) for a in ("-f", str(ROOT / f)))]
        self.project = project
        self.env = {**daemon.env(), "PA_REDIS_PORT": str(redis_port),
                    "PA_SERVE_PORT": str(free_port()), "PA_METRICS_PORT": str(free_port())}

    def run(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run([*self.command, *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode:
            raise RuntimeError(f"docker-compose {' '.join(args)} exited {done.returncode}:\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def docker(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode:
            raise RuntimeError(f"docker {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def exec(self, container: str, *args: str, timeout: float = 60) -> \
            subprocess.CompletedProcess[str]:
        """``args`` run in the container (docker exec), whatever their exit status."""
        return subprocess.run(["docker", "exec", container, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def containers(self, service: str) -> list[str]:
        """Ids of the service's containers, running or not."""
        return self.run("ps", "-q", service).split()

    def running(self, service: str) -> list[str]:
        return [c for c in self.containers(service) if self.state(c, "Running") == "true"]

    def state(self, container: str, field: str) -> str:
        return self.docker("inspect", "-f", f"{{{{.State.{field}}}}}", container).strip()

    def health(self, container: str) -> str:
        """healthy, unhealthy, starting, or none (no healthcheck)"""
        return self.docker("inspect", "-f", "{{if .State.Health}}{{.State.Health.Status}}"
                           "{{else}}none{{end}}", container).strip()

    def wait_healthy(self, containers: list[str], timeout: float = 120) -> None:
        """Wait for Docker's health_status events until every container is healthy."""
        if not containers:
            raise AssertionError("no containers to wait for")
        with self._events("health_status", timeout) as lines:
            # listening first, then looking: a change in between is seen either way
            waiting = {c for c in containers if self.health(c) != "healthy"}
            while waiting:
                line = next(lines, None)
                if line is None:  # --until reached
                    break
                cid, _, status = line.partition(" ")
                if status.strip() == "health_status: healthy":
                    waiting = {c for c in waiting if not c.startswith(cid[:12])}
            if waiting:
                raise AssertionError(f"not healthy in {timeout}s: "
                                     f"{ {c[:12]: self.health(c) for c in waiting} }")

    def kill_and_await_restart(self, container: str, timeout: float = 60) -> None:
        """SIGKILL the container's main process from the host, as a crash or the OOM killer
        would (``docker kill`` is a stop, which Docker does not undo), and wait for Docker's
        start event of the container: its restart policy at work. Needs the daemon on this
        machine, and root."""
        pid = int(self.state(container, "Pid"))
        assert pid > 0, f"{container[:12]} is not running"
        since = f"{time.time():.3f}"  # events from here on, read after the kill: none missed
        os.kill(pid, signal.SIGKILL)
        with self._events("start", timeout, since) as lines:
            for line in lines:
                if container.startswith(line.partition(" ")[0][:12]):
                    return
        raise AssertionError(f"{container[:12]} not restarted within {timeout}s")

    @contextmanager
    def _events(self, event: str, timeout: float,
                since: str | None = None) -> Iterator[Iterator[str]]:
        until = f"{int(time.time() + timeout)}"
        proc = subprocess.Popen(
            ["docker", "events", "--filter", f"event={event}", "--filter",
             f"label=com.docker.compose.project={self.project}", "--until", until,
             *(["--since", since] if since else []), "--format", "{{.ID}} {{.Status}}"],
            env=self.env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        try:
            yield iter(proc.stdout.readline, "")
        finally:
            proc.terminate()
            proc.wait()

    def logs(self, tail: int = 60) -> str:
        try:
            return self.run("logs", "--no-color", "--tail", str(tail), timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return f"(no logs: {exc})"
