"""Webhooks to a real local HTTP receiver that checks every signature: one that accepts, one
that fails twice before it accepts, one that never does (dead letter). Deliveries are dramatiq
tasks in a real worker started with the webhook settings."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from pending_actions.broker.errors import Denied
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from pending_actions.webhooks import DELIVERY, SIGNATURE, TIMESTAMP, sign, verify
from tests.support.procs import Worker, worker_env
from tests.support.waits import wait_until

SECRET = "s3cret-for-tests"


class Receiver:
    def __init__(self, redirect_to: str | None = None) -> None:
        """``redirect_to``: where ``/moved`` sends its requests (a 302)."""
        self.lock = threading.Condition()
        self.accepted: list[tuple[str, dict[str, Any]]] = []  # (path, event)
        self.tries: dict[str, int] = defaultdict(int)  # delivery id -> requests seen
        self.bad_signatures = 0
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                delivery = self.headers["X-Pending-Actions-Delivery"]
                with receiver.lock:
                    receiver.requests += 1
                    if self.path == "/moved" and redirect_to:
                        self.send_response(302)
                        self.send_header("Location", redirect_to)
                    elif not verify(SECRET, dict(self.headers), body):
                        receiver.bad_signatures += 1
                        self.send_response(401)
                    else:
                        receiver.tries[f"{self.path}:{delivery}"] += 1
                        n = receiver.tries[f"{self.path}:{delivery}"]
                        ok = self.path == "/ok" or (self.path == "/flaky" and n > 2)
                        if ok:
                            receiver.accepted.append((self.path, orjson.loads(body)))
                        self.send_response(200 if ok else 503)
                    receiver.lock.notify_all()
                self.end_headers()

            def do_GET(self) -> None:  # what a followed 302 turns the POST into
                with receiver.lock:
                    receiver.requests += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def wait_for(self, check: Any, timeout: float = 30) -> None:
        def holds() -> bool:
            with self.lock:
                return bool(check())

        wait_until(holds, timeout, lambda: f"the receiver's deliveries (it saw {self.accepted}"
                   f" / {dict(self.tries)})", interval_s=0.02)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.http.shutdown()


@pytest.fixture(scope="module")
def notifying_worker(redis_server: EmbeddedRedis, receiver: Receiver) -> Iterator[Worker]:
    urls = ",".join(f"{receiver.url}{p}" for p in ("/ok", "/flaky", "/down"))
    w = Worker(redis_server.url, overrides={
        "webhook_urls": urls, "webhook_secret": SECRET, "webhook_retries": "3",
        "webhook_min_backoff_ms": "50"}).start()
    yield w
    w.stop()


def test_signature_round_trip_and_replay() -> None:
    body = b'{"event":"staged"}'
    now = int(time.time())
    headers = {TIMESTAMP: str(now), DELIVERY: "1-0/0", SIGNATURE: sign(SECRET, now, "1-0/0", body)}
    assert verify(SECRET, headers, body)
    assert not verify("other", headers, body)
    assert not verify(SECRET, headers, body + b" ")
    old = now - 3600  # a captured request replayed an hour later, correctly signed back then
    assert not verify(SECRET, {TIMESTAMP: str(old), DELIVERY: "1-0/0",
                               SIGNATURE: sign(SECRET, old, "1-0/0", body)}, body)
    # the delivery id is signed: replayed now under a new id (past a receiver's duplicate
    # check) it fails, and without one it fails
    assert not verify(SECRET, {**headers, DELIVERY: "2-0/0"}, body)
    assert not verify(SECRET, {k: v for k, v in headers.items() if k != DELIVERY}, body)


def test_stage_and_outcome_delivered_signed_with_retries(
        notifying_worker: Worker, receiver: Receiver, pa: PendingActions) -> None:
    session = f"hook-{uuid.uuid4().hex[:8]}"
    action_id = pa.stage(session=session, tool="deploy", label="Deploy prod", apply="t.ok",
                         tenant="ops")
    result = pa.resolve(session=session, action="apply", reason="go", by="alice")
    assert not result.is_error

    def mine(path: str) -> list[dict[str, Any]]:
        return [e for p, e in receiver.accepted if p == path and e["session"] == session]

    receiver.wait_for(lambda: len(mine("/ok")) == 2 and len(mine("/flaky")) == 2)
    staged, applied = sorted(mine("/ok"), key=lambda e: e["event"] != "staged")
    assert staged["event"] == "staged" and staged["id"] == action_id
    assert staged["tenant"] == "ops" and staged["tool"] == "deploy"
    assert applied["event"] == "applied" and applied["by"] == "alice"
    assert float(applied["at"]) >= float(applied["created_at"])
    assert sorted(e["event"] for e in mine("/flaky")) == ["applied", "staged"]
    with receiver.lock:
        flaky = [n for key, n in receiver.tries.items() if key.startswith("/flaky:")
                 and any(e["session"] == session for p, e in receiver.accepted
                         if p == "/flaky")]
        assert receiver.bad_signatures == 0
    assert flaky and all(n == 3 for n in flaky)  # failed twice, accepted the third time
    # the receiver that never accepts: each event is dead-lettered after its retries
    dead = _wait_dead(pa, session, 2)
    assert {d["url"] for d in dead} == {f"{receiver.url}/down"}
    assert {d["event"]["event"] for d in dead} == {"staged", "applied"}
    assert all(d["retries"] == "3" and "503" in d["error"] for d in dead)


def _wait_dead(pa: PendingActions, session: str, n: int, timeout: float = 30) -> list[Any]:
    key, last = pa.ctx.keys.webhooks_dead, "0-0"
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(found) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"dead letters so far: {found}"
        got: Any = pa.client.xread({key: last}, block=int(min(left, 1) * 1000))
        for _s, entries in got or ():
            for entry_id, raw in entries:
                last = entry_id
                d = {k.decode(): v.decode() for k, v in raw.items()}
                d["event"] = orjson.loads(d["event"])
                if d["event"]["session"] == session:
                    found.append(d)
    return found


def test_a_redirect_is_a_failed_delivery_never_followed(tmp_path: Path) -> None:
    """A receiver answering 302 towards another address: the signed event never reaches that
    address; each try fails, and the delivery ends in the dead letters with the 302."""
    target = Receiver()
    moving = Receiver(redirect_to=f"{target.url}/ok")
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    worker = Worker(server.url, overrides={
        "webhook_urls": f"{moving.url}/moved", "webhook_secret": SECRET,
        "webhook_retries": "1", "webhook_min_backoff_ms": "50"}).start()
    pa = PendingActions.from_url(server.url)
    try:
        session = f"hook-{uuid.uuid4().hex[:8]}"
        pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok")
        dead = _wait_dead(pa, session, 1)
        assert dead[0]["url"] == f"{moving.url}/moved" and "302" in dead[0]["error"], dead
        assert dead[0]["retries"] == "1"
        with moving.lock:
            assert moving.requests == 2  # the first try and its one retry
        with target.lock:
            assert target.requests == 0 and target.accepted == []
    finally:
        pa.close()
        worker.stop()
        server.stop()
        target.http.shutdown()
        moving.http.shutdown()


@pytest.mark.parametrize("bad", ["file:///etc/passwd", "ftp://example.com/x", "example.com/x",
                                 "http://", "https://host:port/"])
def test_webhook_urls_are_checked_before_running(redis_server: EmbeddedRedis,
                                                 bad: str) -> None:
    env = worker_env(redis_server.url, webhook_urls=f"https://example.com/ok,{bad}")
    proc = subprocess.run([sys.executable, "-m", "pending_actions", "worker", "--handlers",
                           "tests.support.handlers"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: PENDING_ACTIONS_WEBHOOK_URLS: {bad!r} is not an " \
        "http:// or https:// URL with a host"


def test_a_person_is_told_when_an_action_waits_for_approval(
        notifying_worker: Worker, receiver: Receiver, pa: PendingActions) -> None:
    """An action its policy asks people for is delivered as a staged event that says so
    (decision ask, the rule, the approvals needed); each approval that is not the last is an
    approved event with who gave it; a denied stage is a denied event with the rule's reason."""
    tenant, session = f"hook-{uuid.uuid4().hex[:6]}", f"hook-{uuid.uuid4().hex[:8]}"
    pa.set_policy({"rules": [
        {"name": "two", "match": {"tool": "deploy"}, "decision": "ask", "approvals": 2},
        {"name": "no-rm", "match": {"tool": "rm"}, "decision": "deny", "reason": "never"}]},
        tenant=tenant)
    action_id = pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok",
                         tenant=tenant)
    assert pa.resolve(session=session, action="apply", reason="ok",
                      approver="alice").text.startswith("Approved 1 of 2")
    with pytest.raises(Denied):
        pa.stage(session=session, tool="rm", label="rm", apply="t.ok", tenant=tenant)

    def mine() -> dict[str, dict[str, Any]]:
        return {e["event"]: e for p, e in receiver.accepted
                if p == "/ok" and e["session"] == session}

    receiver.wait_for(lambda: {"staged", "approved", "denied"} <= set(mine()))
    got = mine()
    asked = got["staged"]
    assert (asked["id"], asked["decision"], asked["rule"], asked["approvals"]) == (
        action_id, "ask", "two", "2")
    assert (got["approved"]["by"], got["approved"]["rule"], got["approved"]["approvals"]) == (
        "alice", "two", "1")
    assert (got["denied"]["rule"], got["denied"]["reason"]) == ("no-rm", "never")
