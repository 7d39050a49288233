"""The real ``pending-actions serve`` process on a free port, beside the real Redis and worker
of the suite, and tokens to talk to it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from pending_actions.serve.auth import Tokens
from tests.conftest import Deployment
from tests.support.procs import Worker, worker_env
from tests.support.waits import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``serve`` with its operator listener (``--metrics-port``) on a second free port; with
    ``log``, its stderr goes to that file (else to ours); ``overrides``: settings of its own
    (``{"serve_body_timeout_s": "1"}``); ``args``: more options, whose output on stdout is then
    the caller's to read (``proc.stdout``)."""

    def __init__(self, url: str, log: Path | None = None,
                 overrides: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with contextlib.ExitStack() as files:
            stderr = files.enter_context(log.open("wb")) if log else None
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pending_actions", "serve", "--port", str(self.port),
                 "--resolve-timeout", "30", "--metrics-port", str(self.metrics_port), *args],
                env=worker_env(url, **(overrides or {})), cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if args else None, stderr=stderr, text=True)
        self.http = httpx.Client(base_url=self.base, timeout=60, trust_env=False)
        self.operator = httpx.Client(base_url=f"http://127.0.0.1:{self.metrics_port}",
                                     timeout=60, trust_env=False)

    def wait_ready(self, timeout: float = 30) -> Server:
        def answering() -> bool:  # the port opens when uvicorn is up: nothing to block on
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}"
            try:
                return self.http.get("/healthz").status_code == 200 and \
                    self.operator.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answering, timeout, f"serve answering on {self.base} and its metrics port")
        return self

    def stop(self) -> None:
        self.http.close()
        self.operator.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def as_(self, token: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"} if token else {}


@pytest.fixture(scope="session")
def server(redis_server: EmbeddedRedis, worker: Worker) -> Iterator[Server]:
    s = Server(redis_server.url).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def tokens(single: Deployment) -> Tokens:
    return Tokens(single.pa.client, single.pa.ctx.keys)

