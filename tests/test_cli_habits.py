"""The command line as people type it (issue 11, item 7): options after the subcommand,
payloads from a file or stdin, --version, readable history times, one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pending_actions.embedded import EmbeddedRedis, free_port
from pending_actions.procs import ROOT
from tests.support.procs import Worker, worker_env


def run(url: str | None, *args: str, stdin: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = worker_env(url or "")
    if not url:
        env.pop("PENDING_ACTIONS_REDIS_URL")
    return subprocess.run([sys.executable, "-m", "pending_actions", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, input=stdin)


def test_json_and_redis_url_after_the_subcommand(redis_server: EmbeddedRedis, worker: Worker,
                                                 session: str) -> None:
    staged = run(None, "stage", "--session", session, "--tool", "edit", "--label", "L",
                 "--apply", "t.ok", "--redis-url", redis_server.url, "--json")
    assert staged.returncode == 0, staged.stderr
    action_id = orjson.loads(staged.stdout)["id"]
    listed = run(None, "ls", "--session", session, "--json", "--redis-url", redis_server.url)
    assert listed.returncode == 0, listed.stderr
    assert [a["id"] for a in orjson.loads(listed.stdout)] == [action_id]
    # before the subcommand still works, and both places together
    both = run(None, "--json", "--redis-url", redis_server.url, "ls", "--session", session,
               "--json")
    assert [a["id"] for a in orjson.loads(both.stdout)] == [action_id]


def test_payload_from_a_file_and_from_stdin(redis_server: EmbeddedRedis, worker: Worker,
                                            session: str, tmp_path: Path) -> None:
    big = {"content": "x" * 200_000, "path": "big.txt"}  # larger than a comfortable argv
    path = tmp_path / "payload.json"
    path.write_bytes(orjson.dumps(big))
    url = redis_server.url
    from_file = run(url, "stage", "--session", session, "--tool", "edit", "--label", "file",
                    "--apply", "t.ok", "--payload", f"@{path}")
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = run(url, "stage", "--session", session, "--tool", "edit", "--label", "stdin",
                     "--apply", "t.ok", "--payload", "-", stdin='{"from": "stdin"}')
    assert from_stdin.returncode == 0, from_stdin.stderr
    shown = orjson.loads(run(url, "show", "--session", session, from_file.stdout.strip(),
                             "--json").stdout)
    assert shown["payload"] == big
    shown = orjson.loads(run(url, "show", "--session", session, from_stdin.stdout.strip(),
                             "--json").stdout)
    assert shown["payload"] == {"from": "stdin"}
    missing = run(url, "stage", "--session", session, "--tool", "edit", "--label", "x",
                  "--apply", "t.ok", "--payload", f"@{tmp_path / 'nope.json'}")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_every_error_says_error_in_one_style() -> None:
    """Issue 41, item 8: bad usage that click finds, bad usage a command finds, bad input and a
    runtime failure all end in one `error: ...` line; bad usage keeps click's usage line and
    its pointer to --help, and exit 2."""
    usage = ["Usage: pending-actions stage [OPTIONS]",
             "Try 'pending-actions stage --help' for help.", ""]
    missing = run(None, "stage", "--session", "s")
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [*usage, "error: Missing option '--tool'."]
    unknown = run(None, "stage", "--session", "s", "--colour", "red")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [*usage, "error: No such option '--colour'."]
    no_redis = run(None, "stage", "--session", "s", "--tool", "t", "--label", "l", "--apply",
                   "a")
    assert no_redis.returncode == 2
    assert no_redis.stderr.splitlines() == [
        *usage, "error: no Redis: pass --redis-url or set PENDING_ACTIONS_REDIS_URL"]
    down = f"redis://127.0.0.1:{free_port()}/0"
    bad = run(down, "stage", "--session", "s", "--tool", "t", "--label", "l", "--apply", "a",
              "--payload", "[1]")
    assert (bad.returncode, bad.stderr) == (2, "error: invalid --payload: must be a JSON object\n")
    gone = run(down, "ls", "--session", "s", timeout=30)
    assert gone.returncode == 1
    assert gone.stderr.startswith("error: Redis is unavailable") and \
        len(gone.stderr.splitlines()) == 1, gone.stderr


def test_version() -> None:
    out = run(None, "--version")
    assert out.returncode == 0 and re.match(r"pending-actions, version \d+\.\d+", out.stdout)


def test_history_has_readable_times(redis_server: EmbeddedRedis, worker: Worker,
                                    session: str) -> None:
    url = redis_server.url
    run(url, "stage", "--session", session, "--tool", "edit", "--label", "L", "--apply",
        "t.ok", "--ttl", "3600")
    run(url, "resolve", "--session", session, "--action", "apply", "--reason", "r")
    out = run(url, "history", "--session", session)
    lines = out.stdout.splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"
    assert [line.split()[2] for line in lines] == ["staged", "taken", "applied"]
    assert all(re.match(stamp, line) for line in lines), lines
    assert re.search(f"expires_at={stamp}", lines[0]), lines[0]
    as_json = orjson.loads(run(url, "history", "--session", session, "--json").stdout)
    assert re.match(stamp, as_json[0]["time"]) and "-" in as_json[0]["at"]


def test_history_names_the_default_when_no_rule_decided(redis_server: EmbeddedRedis,
                                                         worker: Worker, session: str) -> None:
    """Issue 41, item 10: an action the policy's default decided reads `rule=(default)` in the
    history, not an empty `rule=`; one a rule decided names it; --json keeps the entry as
    stored (the empty string)."""
    from pending_actions.producers import PendingActions

    url = redis_server.url
    tenant = f"h-{session[-8:]}"
    pa = PendingActions.from_url(url)
    pa.set_policy({"default": "ask", "rules": [{"name": "reads", "match": {"tool": "read_*"},
                                                "decision": "allow"}]}, tenant=tenant)
    pa.close()
    for tool in ("edit", "read_file"):
        staged = run(url, "stage", "--session", session, "--tool", tool, "--label", "L",
                     "--apply", "t.ok", "--tenant", tenant)
        assert staged.returncode == 0, staged.stderr
    lines = run(url, "history", "--session", session).stdout.splitlines()
    assert [re.search(r" decision=(\S+)  rule=(\S*)", line).groups()  # type: ignore[union-attr]
            for line in lines] == [("ask", "(default)"), ("allow", "reads")], lines
    as_json = orjson.loads(run(url, "history", "--session", session, "--json").stdout)
    assert [e["rule"] for e in as_json] == ["", "reads"]


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--redis-url", "nonsense://x", "ls", "--session", "s"], 2, "bad Redis URL"),
    (["ls", "--session", "s", "--redis-url", "http://localhost:1"], 2, "bad Redis URL"),
    (["--redis-url", "redis://127.0.0.1:{port}/0", "ls", "--session", "s"], 1,
     "Redis is unavailable"),
    (["--redis-url", "redis://127.0.0.1:{port}/0", "resolve", "--session", "s", "--action",
      "apply", "--reason", "r", "--edit", "[1]"], 2, "--edit"),
    # a worker whose id file could never be written, and ids that are no worker's id file
    (["--redis-url", "redis://127.0.0.1:{port}/0", "worker", "--id-file", "/nowhere/id"], 2,
     "cannot write the worker id file /nowhere/id"),
    (["--redis-url", "redis://127.0.0.1:{port}/0", "health", "--worker", "@"], 2,
     "--worker @PATH needs a path"),
    (["--redis-url", "redis://127.0.0.1:{port}/0", "health", "--worker", "@/"], 2,
     "cannot read the worker id file /"),
])
def test_errors_are_one_line(args: list[str], code: int, needle: str) -> None:
    port = str(free_port())
    out = run(None, *[a.replace("{port}", port) for a in args], timeout=60)
    assert out.returncode == code, out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2, \
        out.stderr


def test_edit_and_expect_id_from_the_command_line(redis_server: EmbeddedRedis, worker: Worker,
                                                  session: str) -> None:
    url = redis_server.url
    first = run(url, "stage", "--session", session, "--tool", "edit", "--label", "A",
                "--apply", "t.seen", "--payload", '{"n": 1}',
                "--schema", '{"type": "object", "properties": {"n": {"type": "integer"}}}')
    action_id = first.stdout.strip()
    bad = run(url, "resolve", "--session", session, "--action", "apply", "--reason", "r",
              "--edit", '{"n": "one"}')
    assert bad.returncode == 2 and "invalid edit" in bad.stderr, bad.stderr
    wrong = run(url, "resolve", "--session", session, "--action", "apply", "--reason", "r",
                "--expect-id", "pending-action:edit:0", "--json")
    assert wrong.returncode == 1 and "expect_id" in orjson.loads(wrong.stdout)["details"]
    good = run(url, "resolve", "--session", session, "--action", "apply", "--reason", "r",
               "--edit", '{"n": 2}', "--expect-id", action_id, "--json")
    assert good.returncode == 0, good.stderr
    assert orjson.loads(good.stdout)["details"]["sourceResultDetails"]["payload"] == {"n": 2}


def nested_json(levels: int) -> str:
    return '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1)


@pytest.mark.parametrize("option", ["--payload", "--schema", "--extra", "--edit"])
def test_deep_json_is_one_line_and_exit_2(redis_server: EmbeddedRedis, worker: Worker,
                                          session: str, option: str) -> None:
    """600 levels (issue 29, item 13): one line naming the field, exit 2, nothing written."""
    import redis

    from tests.support.unchanged import redis_unchanged

    url = redis_server.url
    run(url, "stage", "--session", session, "--tool", "edit", "--label", "L", "--apply",
        "t.ok")
    command = ["stage", "--session", session, "--tool", "edit", "--label", "deep",
               "--apply", "t.ok"] if option in ("--payload", "--schema") else \
        ["resolve", "--session", session, "--action", "apply", "--reason", "r"]
    rc = redis.Redis.from_url(url)
    with redis_unchanged(rc):
        out = run(url, *command, option, "-", stdin=nested_json(600))
    rc.close()
    assert out.returncode == 2, out.stderr
    field = option.removeprefix("--")
    assert out.stderr.strip() == f"error: invalid {field}: nested deeper than 64 levels", \
        out.stderr


def test_stage_into_a_tenant(redis_server: EmbeddedRedis, worker: Worker, session: str) -> None:
    url = redis_server.url
    tenant = f"cli-{session[-8:]}"
    staged = run(url, "stage", "--session", session, "--tool", "edit", "--label", "L",
                 "--apply", "t.ok", "--tenant", tenant, "--json")
    assert staged.returncode == 0, staged.stderr
    action_id = orjson.loads(staged.stdout)["id"]
    listed = orjson.loads(run(url, "ls", "--all", "--tenant", tenant, "--json").stdout)
    assert [(a["id"], a["tenant"]) for a in listed] == [(action_id, tenant)]
    # the session is that tenant's now: another's stage is refused, one line, exit 1
    other = run(url, "stage", "--session", session, "--tool", "edit", "--label", "L",
                "--apply", "t.ok", "--tenant", "someone-else")
    assert other.returncode == 1, other.stderr
    assert other.stderr.strip() == f"error: session {session!r} belongs to another tenant"
    # without --tenant (issue 41, item 9): the line says that this is what is missing
    plain = run(url, "stage", "--session", session, "--tool", "edit", "--label", "L",
                "--apply", "t.ok")
    assert plain.returncode == 1, plain.stderr
    assert plain.stderr.strip() == (
        f"error: session {session!r} belongs to another tenant; without --tenant a stage is "
        "for tenant 'default': pass --tenant with the session's tenant")
    bad = run(url, "stage", "--session", session, "--tool", "edit", "--label", "L",
              "--apply", "t.ok", "--tenant", "no spaces")
    assert bad.returncode == 2 and "invalid tenant" in bad.stderr
