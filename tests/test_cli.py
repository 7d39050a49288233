"""The command line as a user runs it: real subprocesses, exit codes, --json, and `up`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
import redis

from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis, free_port
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from tests.support.procs import Worker, worker_env
from tests.support.up import await_up, spawn_up


def cli(url: str | None, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = worker_env(url) if url else worker_env("")
    if not url:
        env.pop("PENDING_ACTIONS_REDIS_URL")
    return subprocess.run([sys.executable, "-m", "pending_actions", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_stage_ls_resolve_history(redis_server: EmbeddedRedis, worker: Worker,
                                  session: str) -> None:
    url = redis_server.url
    staged = cli(url, "stage", "--session", session, "--tool", "edit", "--label", "Fix typo",
                 "--apply", "t.ok", "--payload", '{"path": "a.py"}')
    assert staged.returncode == 0, staged.stderr
    action_id = staged.stdout.strip()
    assert action_id.startswith("pending-action:edit:")
    listed = cli(url, "--json", "ls", "--session", session)
    assert [a["id"] for a in orjson.loads(listed.stdout)] == [action_id]
    shown = cli(url, "--json", "show", "--session", session, action_id)
    assert orjson.loads(shown.stdout)["payload"] == {"path": "a.py"}
    done = cli(url, "--json", "resolve", "--session", session, "--action", "apply",
               "--reason", "ok", "--extra", '{"k": 1}')
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["content"][0]["text"] == f"applied {action_id}"
    assert result["details"]["extra"] == {"k": 1}
    human = cli(url, "resolve", "--session", session, "--action", "apply", "--reason", "again")
    assert human.returncode == 1
    assert "No pending action to resolve" in human.stdout
    events = orjson.loads(cli(url, "--json", "history", "--session", session).stdout)
    assert [e["event"] for e in events] == ["staged", "taken", "applied"]
    stats = orjson.loads(cli(url, "--json", "stats").stdout)
    assert "t.ok" in stats["handlers"]


@pytest.mark.parametrize("args", [
    ["resolve", "--session", "s", "--action", "commit", "--reason", "r"],
    ["resolve", "--session", "s", "--action", "apply"],
    ["resolve", "--session", "s", "--action", "apply", "--reason", "r", "--extra", "[1]"],
    ["resolve", "--session", "bad id", "--action", "apply", "--reason", "r"],
    ["stage", "--session", "s", "--tool", "t", "--label", "l", "--apply", "t.ok",
     "--payload", "nope"],
    ["stage", "--session", "s", "--tool", "t", "--label", "l", "--apply", "no.such"],
    ["resolve", "--session", "s", "--action", "apply", "--reason", "r", "--timeout", "0"],
    ["frobnicate"],
])
def test_bad_usage_exits_2(redis_server: EmbeddedRedis, worker: Worker,
                           args: list[str]) -> None:
    res = cli(redis_server.url, *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    # one style for click's errors and ours (issue 41, item 8): the last line, lowercase
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("error: "), res.stderr
    assert not any(line.startswith("Error") for line in lines), res.stderr


def test_no_redis_url_is_a_usage_error() -> None:
    res = cli(None, "ls", "--session", "s")
    assert res.returncode == 2
    assert "PENDING_ACTIONS_REDIS_URL" in res.stderr


def test_redis_down_fails_fast_with_exit_1() -> None:
    res = cli(f"redis://127.0.0.1:{free_port()}/0", "ls", "--session", "s", timeout=30)
    assert res.returncode == 1
    assert "Redis is unavailable" in res.stderr


def test_help_explains_every_command() -> None:
    for command in ("up", "worker", "stage", "resolve", "ls", "show", "history", "stats"):
        res = cli(None, command, "--help")
        assert res.returncode == 0, res.stderr
        usage, description, *rest = res.stdout.split("\n\n")
        assert usage.startswith(f"Usage: pending-actions {command}")
        assert len(description.split()) >= 6  # a sentence, not a stub
        assert rest[-1].startswith("Options:")


def test_up_runs_everything_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group, while a
    handler is running. The handler finishes and its outcome is recorded (so Redis and the
    dramatiq worker outlive the signal until then), and everything exits."""
    port = free_port()
    proc = spawn_up(tmp_path / "data", port)
    try:
        url = await_up(proc, port)
        client = redis.Redis.from_url(url)
        staged = cli(url, "stage", "--session", "demo", "--tool", "edit", "--label", "L",
                     "--apply", "examples.echo")
        assert staged.returncode == 0, staged.stderr
        done = cli(url, "resolve", "--session", "demo", "--action", "apply", "--reason", "r")
        assert done.returncode == 0 and "Applied L: r" in done.stdout

        pa = PendingActions.from_url(url)
        gated = pa.stage(session="demo", tool="edit", label="G", apply="t.gate",
                         payload={"gate": "gate:demo"})
        waiting = ThreadPoolExecutor(1).submit(pa.resolve, session="demo", action="apply",
                                               reason="r", timeout=60)
        assert client.blpop(["test:started:demo"], timeout=30) is not None
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        client.rpush("gate:demo", "open")  # the running handler may now finish
        result = waiting.result(timeout=60)
        assert not result.is_error and result.text == f"gated {gated} done", result.text
        pa.close()
        assert proc.wait(60) == 0
        with pytest.raises(redis.ConnectionError):
            client.ping()
        assert (tmp_path / "data").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(("module", "why"), [
    ("no.such.module", "ModuleNotFoundError: No module named 'no'"),
    ("explodes_on_import", "RuntimeError: exploded at import"),
])
def test_a_bad_handler_module_stops_worker_before_it_runs(redis_server: EmbeddedRedis,
                                                          tmp_path: Path, module: str,
                                                          why: str) -> None:
    """Issue 29, item 14: one line naming the module and what its import raised, exit 2,
    before "running", with no dramatiq traceback; nothing registered in Redis."""
    (tmp_path / "explodes_on_import.py").write_text('raise RuntimeError("exploded at import")\n')
    env = worker_env(redis_server.url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    lifecycle = Keys().workers  # a worker that starts says so there
    workers = redis.Redis.from_url(redis_server.url).xlen(lifecycle)
    proc = subprocess.run([sys.executable, "-m", "pending_actions", "worker", "--handlers",
                           f"tests.support.handlers,{module}"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: cannot import handler module {module!r}: {why}"
    assert proc.stdout == ""
    assert redis.Redis.from_url(redis_server.url).xlen(lifecycle) == workers
