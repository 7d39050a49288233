"""`up` cannot mislead: a port in use is an error naming it, and nothing `up` or `worker`
started outlives them, whatever kills them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis, check_port_free, free_port
from pending_actions.procs import ROOT, ExitWatch, StreamWatch
from tests.support.procs import Worker
from tests.support.unchanged import redis_unchanged
from tests.support.up import await_up, spawn_up, up_children, up_env


def test_port_in_use_is_an_error_naming_it(redis_server: EmbeddedRedis,
                                           tmp_path: Path) -> None:
    """Another Redis on the port: `up` must neither use it nor say it started its own."""
    other: Any = redis.Redis.from_url(redis_server.url)
    other.set("someone-elses", "data")
    # nothing written to it, nothing deleted (a key of an earlier test that expires meanwhile
    # is no change: the snapshot tells an expiry from a delete)
    with redis_unchanged(other):
        proc = spawn_up(tmp_path / "data", redis_server.port, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()  # a no-op unless it went on to run against the other server
    assert proc.returncode == 2, (out, err)
    assert out == ""  # no export line: nothing was started
    errors = [line for line in err.splitlines() if "rror" in line]
    assert len(errors) == 1 and f"port {redis_server.port} is already in use" in errors[0], err
    assert "Traceback" not in err and "embedded redis-server" not in err
    assert not (tmp_path / "data").exists()  # refused: no data folder left (issue 41, item 9)
    other.close()


def test_up_with_the_url_only_exported_refuses(redis_server: EmbeddedRedis,
                                               tmp_path: Path) -> None:
    """Issue 41, item 9: `up` in a shell where an earlier `up`'s export line was run would join
    that Redis as one more worker, quietly. PENDING_ACTIONS_REDIS_URL alone is refused (one
    line naming both ways on, exit 2, nothing started or written, no data folder); the same
    URL given as --redis-url is the deliberate choice, and runs against that Redis."""
    port = free_port()
    command = [sys.executable, "-m", "pending_actions", "up", "--handlers",
               "tests.support.handlers", "--port", str(port), "--data-dir", str(tmp_path / "data")]
    client: Any = redis.Redis.from_url(redis_server.url)
    with redis_unchanged(client):
        proc = subprocess.run(command, env={**up_env(), "PENDING_ACTIONS_REDIS_URL":
                                            redis_server.url},
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: PENDING_ACTIONS_REDIS_URL is set ({redis_server.url}), and `up` starts a Redis "
        "of its own: unset it for that, or pass --redis-url to run against that Redis instead")
    assert proc.stdout == "" and not (tmp_path / "data").exists()
    check_port_free(port)
    # on purpose: --redis-url, the variable set too; its resolver and dramatiq say they run
    watch = StreamWatch(redis_server.url, Keys().workers)
    joined = subprocess.Popen([*command, "--redis-url", redis_server.url],
                              env={**up_env(), "PENDING_ACTIONS_REDIS_URL": redis_server.url},
                              cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    with _killed_at_end(joined):
        ready: set[bytes] = set()
        while ready != {b"resolver", b"dramatiq"}:
            got = watch.read(60)
            assert got, "up --redis-url never became ready"
            ready.update(f[b"role"] for f in got)
        watch.close()
        joined.terminate()
        out, _err = joined.communicate(timeout=60)
    assert joined.returncode == 0
    assert out == "" and not (tmp_path / "data").exists()  # no Redis of its own
    client.close()


def _run_up(tmp_path: Path) -> tuple[subprocess.Popen[str], str, dict[str, list[int]]]:
    port = free_port()
    proc = spawn_up(tmp_path / "data", port)
    try:
        url = await_up(proc, port)
        children = up_children(proc, url)
    except BaseException:
        proc.kill()
        raise
    assert children["redis-server"] and len(children["dramatiq"]) >= 2  # master + a worker
    return proc, url, children


@contextlib.contextmanager
def _killed_at_end(proc: subprocess.Popen[str]) -> Iterator[None]:
    """If the test fails, stop whatever it started; SIGTERM, which `up` passes on."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP"])
def test_nothing_outlives_up(tmp_path: Path, how: str) -> None:
    """SIGKILL (no chance to clean up) and SIGHUP to the job's process group (the terminal was
    closed): redis-server, the dramatiq master and its worker processes all end."""
    proc, url, children = _run_up(tmp_path)
    with _killed_at_end(proc), ExitWatch([p for pids in children.values() for p in pids]) as exits:
        if how == "SIGKILL":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGHUP)
        code = proc.wait(timeout=60)
        assert exits.wait(timeout=60) == [], children
    proc.communicate()  # only now: an orphan would hold the pipes open
    assert code == (-signal.SIGKILL if how == "SIGKILL" else 0)
    client = redis.Redis.from_url(url)
    with pytest.raises(redis.ConnectionError):
        client.ping()


def test_nothing_outlives_worker(redis_server: EmbeddedRedis) -> None:
    """SIGKILL of the `worker` command alone: its dramatiq processes stop too."""
    worker = Worker(redis_server.url).start()
    try:
        below = worker.tree()[1:]
        assert len(below) >= 2  # the dramatiq master and a worker process
        with ExitWatch(below) as exits:
            os.kill(worker.pid, signal.SIGKILL)
            assert exits.wait(timeout=60) == []
    finally:
        worker.kill()


def test_a_bad_handler_module_stops_up_before_it_starts_anything(tmp_path: Path) -> None:
    """`up --handlers no.such.module`: one line, exit 2, no export line, no Redis started."""
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "pending_actions", "up", "--handlers", "no.such.module",
         "--port", str(port), "--data-dir", str(tmp_path / "data")],
        env=up_env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: cannot import handler module 'no.such.module': " \
        "ModuleNotFoundError: No module named 'no'"
    assert proc.stdout == ""
    assert not (tmp_path / "data").exists()
    check_port_free(port)  # raises if a redis-server was left on it
