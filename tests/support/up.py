"""``pending-actions up`` as a user runs it: in a process group of its own, as a shell runs a
foreground job, so that a test can signal it the way a terminal would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from pending_actions.broker.keys import Keys
from pending_actions.procs import ROOT, StreamWatch, descendants
from tests.support.procs import worker_env

HANDLERS = ["pending_actions.workers.examples", "tests.support.handlers"]


def up_env() -> dict[str, str]:
    env = worker_env("")
    env.pop("PENDING_ACTIONS_REDIS_URL")
    return env


def spawn_up(data_dir: Path, port: int, stderr: int | None = None) -> subprocess.Popen[str]:
    """``up`` with its stdout piped to us; its log goes to ours (pytest shows it on a failure)
    unless ``stderr`` says otherwise."""
    # Not procs.Child: this stands in for a shell, whose job is a session of its own.
    return subprocess.Popen(
        [sys.executable, "-m", "pending_actions", "up", "--handlers", *HANDLERS,
         "--port", str(port), "--data-dir", str(data_dir)],
        env=up_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
        start_new_session=True)


def await_up(proc: subprocess.Popen[str], port: int, timeout_ms: int = 20_000) -> str:
    """Wait until ``up`` has printed its URL and its resolver and dramatiq are ready; the URL."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the embedded Redis answers
    url = f"redis://127.0.0.1:{port}/0"
    assert line.strip() == f"export PENDING_ACTIONS_REDIS_URL={url}", line
    watch = StreamWatch(url, Keys().workers, b"0-0")
    ready: set[bytes] = set()
    try:
        while ready != {b"resolver", b"dramatiq"}:
            got = watch.read(timeout_ms / 1000)
            assert got, "up never became ready"
            ready.update(fields[b"role"] for fields in got)
    finally:
        watch.close()
    return url


def up_children(proc: subprocess.Popen[str], url: str) -> dict[str, list[int]]:
    """Every process below ``up``, by kind: the embedded Redis and dramatiq's processes."""
    client: Any = redis.Redis.from_url(url)  # redis-py types replies as unions
    redis_pid = int(client.info("server")["process_id"])
    client.close()
    below = descendants(proc.pid)[1:]
    assert redis_pid in below
    return {"redis-server": [redis_pid], "dramatiq": [p for p in below if p != redis_pid]}

