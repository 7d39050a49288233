"""Redis SIGKILLed under a running ``serve`` (issue 29, item 12): every route that needs Redis
answers 503 with a JSON error, a resolve waiting on a handler included; the page still loads;
the operator's /metrics says ``redis_up 0``; the log has one warning line for the outage and
no traceback; when Redis is back, so are the answers."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.serve.conftest import Server
from tests.support.procs import Worker
from tests.support.waits import wait_until

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2


def routes(session: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", "/v1/inbox", None),
        ("GET", "/metrics", None),
        ("GET", f"/v1/sessions/{session}/pending", None),
        ("POST", f"/v1/sessions/{session}/actions",
         {"tool": "edit", "label": "l", "apply": "t.ok"}),
        ("POST", f"/v1/sessions/{session}/resolve", {"action": "apply", "reason": "r"}),
        ("POST", "/v1/resolve-batch",
         {"items": [{"session": session, "id": "pending-action:edit:1", "action": "apply",
                     "reason": "r"}]}),
        ("GET", "/v1/policy", None),
        ("PUT", "/v1/policy", {"rules": []}),
    ]


def test_every_route_answers_503_while_redis_is_down(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    server_redis = EmbeddedRedis(directory=data).start()
    worker = Worker(server_redis.url).start()
    pa = PendingActions.from_url(server_redis.url, resolve_timeout_s=60)
    admin, _ = Tokens(pa.client, pa.ctx.keys).create("down", "admin")
    session, gate = f"down-{uuid.uuid4().hex[:8]}", f"gate-{uuid.uuid4().hex[:8]}"
    pa.stage(session=session, tool="edit", label="waits", apply="t.gate",
             payload={"gate": gate}, tenant="down")
    log = tmp_path / "serve.log"
    server = Server(server_redis.url, log=log).wait_ready()
    rc = redis.Redis.from_url(server_redis.url)
    try:
        auth = server.as_(admin)
        for method, path, body in routes(session)[:3]:
            assert server.http.request(method, path, headers=auth, json=body).status_code == 200
        # a resolve waiting on its handler when Redis goes
        waiting: list[httpx.Response] = []
        resolving = threading.Thread(target=lambda: waiting.append(server.http.post(
            f"/v1/sessions/{session}/resolve", headers=auth,
            json={"action": "apply", "reason": "r"})))
        resolving.start()
        assert rc.blpop([f"test:started:{session}"], timeout=30) is not None
        rc.close()
        server_redis.kill()

        resolving.join(60)
        assert waiting and waiting[0].status_code == 503, waiting
        assert "Redis" in waiting[0].json()["error"]
        for method, path, body in routes(session):
            started = time.monotonic()
            r = server.http.request(method, path, headers=auth, json=body)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert set(r.json()) == {"error"} and "Redis" in r.json()["error"], r.json()
            assert r.headers["content-type"] == "application/json"
            assert time.monotonic() - started < 10, path
        health = server.http.get("/healthz")
        assert health.status_code == 503 and health.json()["ok"] is False
        assert server.http.get("/").status_code == 200  # the page itself needs no Redis
        assert server.http.get("/v1/inbox").status_code == 401  # no token: still no token
        operator = server.operator.get("/metrics")
        assert operator.status_code == 200
        assert "pending_actions_redis_up 0.0" in operator.text

        # back: the same routes answer again
        server_redis.start()
        wait_until(lambda: server.http.get("/v1/inbox", headers=auth).status_code == 200, 30,
                   "serve coming back with Redis", interval_s=0.2)
    finally:
        server.stop()
        worker.stop()
        server_redis.stop()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    warnings = [line for line in text.splitlines() if "Redis unavailable" in line]
    assert len(warnings) == 1, text[-3000:]
    assert "Redis is back" in text
