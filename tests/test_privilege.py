"""Least privilege and clear errors: the service runs as the ACL users `pending-actions acl`
prints; a wrong password, a wrong database, a bad URL or a server that is not Redis is one
line and a non-zero exit, never a traceback; what finished sessions leave expires."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import redis

from pending_actions.broker.errors import ConfigError, Forbidden, PendingActionsError
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from pending_actions_harness.supervise import WorkerProcess
from tests.support.faults import FAST, K, cluster
from tests.support.load import wait_healthy
from tests.support.procs import TEST_ENV, worker_env
from tests.support.replies import byte_list


def cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args],
                          env={**worker_env(url), **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def user_url(url: str, user: str, password: str) -> str:
    return url.replace("redis://", f"redis://{user}:{password}@")


def make_user(rc: redis.Redis, url: str, role: str) -> str:
    got = cli(url, "--json", "acl", "--role", role, "--password", f"pw-{role}")
    assert got.returncode == 0, got.stderr
    spec = orjson.loads(got.stdout)
    rc.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", spec["user"], "reset", *spec["rules"])
    return user_url(url, spec["user"], f"pw-{role}")


def test_the_service_runs_as_its_acl_users(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, _w, _pa):
        rc = redis.Redis.from_url(server.url)
        worker_url = make_user(rc, server.url, "worker")
        producer_url = make_user(rc, server.url, "producer")
        assert "+flushall" not in str(rc.acl_getuser("pa-worker"))
        env = {**TEST_ENV, "TEST_RECORD_URL": server.url}  # the test handlers' own records
        w = WorkerProcess(worker_url, "tests.support.handlers", FAST, env=env).start()
        try:
            pa = PendingActions.from_url(producer_url)
            action_id = pa.stage(session="s", tool="t", label="L", apply="t.idem")
            assert [a.id for a in pa.pending("s")] == [action_id]
            result = pa.resolve(session="s", action="apply", reason="r", timeout=20)
            assert not result.is_error, result.text
            pa.stage(session="s", tool="t", label="L", apply="t.crash")
            crashed = pa.resolve(session="s", action="apply", reason="r", timeout=20)
            assert crashed.is_error and "worker" in crashed.text.lower()  # recovery ran
            wait_healthy(worker_url)
            assert cli(producer_url, "ls", "--session", "s").returncode == 0
            # the producer user cannot read the request stream as a worker would
            with pytest.raises(Forbidden), pa.ctx.client.pipeline() as p, __import__(
                    "pending_actions.broker.failures", fromlist=["x"]).redis_errors():
                p.xreadgroup("resolvers", "me", {K.requests(0): ">"}, count=1)
                p.execute()
            w.check_alive()
        finally:
            w.kill()


def test_wrong_password_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, _w, _pa):
        rc = redis.Redis.from_url(server.url)
        make_user(rc, server.url, "worker")
        bad = user_url(server.url, "pa-worker", "wrong")
        started = time.monotonic()
        got = cli(bad, "worker", "--handlers", "tests.support.handlers")
        assert got.returncode == 1
        assert "refused the credentials" in got.stderr and "Traceback" not in got.stderr
        assert "wrong" not in got.stderr  # the password is never printed
        assert time.monotonic() - started < 30
        with pytest.raises(Forbidden):
            PendingActions.from_url(bad).pending("s")


def fake_server() -> tuple[int, threading.Event]:
    """A TCP server that answers like a web server, not like Redis."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _a = sock.accept()
            except TimeoutError:
                continue
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()
        sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1], stop


def test_clear_errors_where_a_client_looks(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, _w, _pa):
        port, stop = fake_server()
        try:
            cases = {
                "http://localhost:1/0": ("bad Redis URL", ConfigError),
                server.url.rsplit("/", 1)[0] + "/99": ("database number", ConfigError),
                f"redis://127.0.0.1:{port}/0": ("Redis protocol", PendingActionsError),
            }
            for url, (words, error) in cases.items():
                got = cli(url, "ls", "--session", "s")
                assert got.returncode in (1, 2), got
                assert words in got.stderr and "Traceback" not in got.stderr, got.stderr
                assert len(got.stderr.strip().splitlines()) <= 3, got.stderr
                with pytest.raises(error):
                    PendingActions.from_url(url).pending("s")
        finally:
            stop.set()


def test_reason_and_extra_limits(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, _w, _pa):
        pa = PendingActions.from_url(server.url, max_reason_chars=100, max_extra_bytes=50)
        with pytest.raises(PendingActionsError, match="reason"):
            pa.resolve(session="s", action="apply", reason="x" * 101)
        with pytest.raises(PendingActionsError, match="extra"):
            pa.resolve(session="s", action="apply", reason="r", extra={"k": "v" * 60})
        rc = redis.Redis.from_url(server.url)
        assert not any(rc.exists(K.requests(p)) for p in range(K.partitions))  # nothing sent


def test_finished_sessions_expire_and_pending_ones_stay(tmp_path: Path) -> None:
    """Retention 1 s: a finished session's history expires and it leaves the sessions hashes
    (its tenant claim with it) and sets; a session with a pending or a dead-lettered action
    keeps everything. A per-session expiry zset an older version left goes with its session."""
    with cluster(tmp_path, retention_s="1", housekeeping_s="0.2") as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        for i in range(50):
            pa.stage(session=f"done-{i}", tool="t", label="L", apply="t.idem")
            assert not pa.resolve(session=f"done-{i}", action="apply", reason="r").is_error
        kept = pa.stage(session="live", tool="t", label="L", apply="t.idem")
        for session in ("done-0", "done-1", "live"):  # as an older version left them
            rc.zadd(K.legacy_expiry(session), {"pending-action:t:1": 1})
        rc.lpush(K.dead("dead"), orjson.dumps({"id": "x", "reason": "r"}))
        rc.hset(K.sessions(K.partition("dead")), "dead", "default")

        def members() -> set[str]:
            return {m.decode() for p in range(K.partitions)
                    for m in byte_list(list(rc.hkeys(K.sessions(p))))}

        deadline = time.monotonic() + 20
        while len(members()) > 2:
            assert time.monotonic() < deadline, members()
            time.sleep(0.2)
        assert members() == {"live", "dead"}
        assert not any(rc.exists(K.history(f"done-{i}")) for i in range(50))
        assert not rc.exists(K.legacy_expiry("done-0"), K.legacy_expiry("done-1"))
        assert rc.exists(K.legacy_expiry("live"))
        assert [a.id for a in pa.pending("live")] == [kept]
        assert rc.ttl(K.history("live")) == -1 and rc.llen(K.dead("dead")) == 1
        # what 50 finished sessions leave after retention: only their request marker and
        # reply, which expire on their own ttl (reply_ttl_s)
        left = byte_list(list(rc.scan_iter(match="pa:{*}:s:done-*", count=1000)))
        assert {k.split(b":")[4] for k in left} <= {b"req", b"reply"}
        assert all(rc.ttl(k) > 0 for k in left) and 50 <= len(left) <= 2 * 50
        per = sum(int(rc.memory_usage(k) or 0) for k in left) / 50
        feed = int(rc.memory_usage(K.events) or 0) / 100  # 2 entries per action, capped
        print(f"after retention, per finished session: {len(left) / 50:.0f} keys, {per:.0f} B "
              f"(until reply_ttl_s), 0 B after; the capped event feed {feed:.0f} B per action")
