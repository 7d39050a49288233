"""Policies over HTTP, against the real server process, Redis (one server and the test
cluster) and worker: ``GET/PUT /v1/policy`` for admin tokens only (approver and producer tokens
get 403, Redis unchanged), a bad document is a 400 naming the rule and the field, approver
tokens are counted as approvals (two people through the API apply once, by the second), an
older revision is a 409, and the metrics count denials and approvals per rule."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from pending_actions.broker.errors import Denied
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.conftest import Deployment
from tests.serve.conftest import Server
from tests.support.runs import runs
from tests.support.unchanged import redis_unchanged
from tests.support.waits import wait_until

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

POLICY = {"default": "allow", "rules": [
    {"name": "two", "match": {"tool": "deploy"}, "decision": "ask", "approvals": 2},
    {"name": "no-rm", "match": {"tool": "shell"}, "decision": "deny", "reason": "no shell"}]}


@pytest.fixture(scope="module")
def cluster_server(clustered: Deployment) -> Iterator[Server]:
    s = Server(clustered.url).wait_ready()
    yield s
    s.stop()


@pytest.fixture(params=["single", "cluster"])
def on(request: pytest.FixtureRequest) -> tuple[Server, PendingActions, Tokens]:
    """serve, a client and the token store, on one Redis or on the test cluster."""
    if request.param == "single":
        server: Server = request.getfixturevalue("server")
        return server, request.getfixturevalue("pa"), request.getfixturevalue("tokens")
    deployment: Deployment = request.getfixturevalue("clustered")
    return (request.getfixturevalue("cluster_server"), deployment.pa,
            Tokens(deployment.pa.client, deployment.pa.ctx.keys))


def test_policy_routes_are_for_admins(on: tuple[Server, PendingActions, Tokens]) -> None:
    server, pa, tokens = on
    rc = pa.client
    t = f"t-{uuid.uuid4().hex[:8]}"
    admin, _ = tokens.create(t, "admin")
    approver, _ = tokens.create(t, "approver")
    producer, _ = tokens.create(t, "producer")
    http = server.http
    assert http.get("/v1/policy", headers=server.as_(admin)).status_code == 404  # none yet
    with redis_unchanged(rc):
        for token in (approver, producer):
            r = http.put("/v1/policy", headers=server.as_(token), json=POLICY)
            assert r.status_code == 403 and "admin" in r.json()["error"], r.text
            assert http.get("/v1/policy", headers=server.as_(token)).status_code == 403
        r = http.put("/v1/policy", headers=server.as_(admin), json={"rules": [
            {"name": "x", "match": {}, "decision": "allow", "approvals": 2}]})
        assert r.status_code == 400 and r.json()["field"] == "rules[0].approvals", r.text
        assert "rule 'x'" in r.json()["error"]
    r = http.put("/v1/policy", headers=server.as_(admin), json=POLICY)
    assert r.status_code == 200 and r.json() == {"tenant": t, "version": 1}, r.text
    got = http.get("/v1/policy", headers=server.as_(admin)).json()
    assert (got["version"], got["document"], got["by"]) == (1, POLICY, _name(tokens, admin))
    assert pa.get_policy(t) == got


def _name(tokens: Tokens, token: str) -> str:
    who = tokens.lookup(token)
    assert who is not None
    return who.name


def test_approver_tokens_are_counted_as_approvals(
        on: tuple[Server, PendingActions, Tokens]) -> None:
    server, pa, tokens = on
    t = f"t-{uuid.uuid4().hex[:8]}"
    pa.set_policy(POLICY, tenant=t)
    alice, _ = tokens.create(t, "approver", name=f"alice-{uuid.uuid4().hex[:4]}")
    bob, _ = tokens.create(t, "approver", name=f"bob-{uuid.uuid4().hex[:4]}")
    admin, _ = tokens.create(t, "admin")
    s = f"web-{uuid.uuid4().hex[:8]}"
    action_id = pa.stage(session=s, tool="deploy", label="Deploy", apply="t.ok", tenant=t)
    http = server.http
    inbox = http.get("/v1/inbox", headers=server.as_(alice)).json()["actions"]
    assert [(a["policy"]["rule"], a["policy"]["approvals"], a["approved_by"]) for a in inbox] \
        == [("two", 2, [])]
    body = {"action": "apply", "reason": "ok", "expect_id": action_id, "revision": 0}
    first = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(alice), json=body)
    assert first.status_code == 200 and first.json()["content"][0]["text"].startswith(
        "Approved 1 of 2"), first.text
    stale = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(bob),
                      json={**body, "revision": 3})
    assert stale.status_code == 409 and stale.json()["is_error"], stale.text
    second = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(bob), json=body)
    assert second.status_code == 200 and second.json()["content"][0]["text"] == \
        f"applied {action_id}", second.text
    assert [r["id"] for r in runs(pa.client, s)] == [action_id]
    producer, _ = tokens.create(t, "producer")
    refused = http.post(f"/v1/sessions/{s}/actions", headers=server.as_(producer),
                        json={"tool": "shell", "label": "ls", "apply": "t.ok"})
    assert refused.status_code == 403 and refused.json()["rule"] == "no-rm", refused.text
    assert refused.json()["reason"] == "no shell"
    with pytest.raises(Denied):
        pa.stage(session=s, tool="shell", label="ls", apply="t.ok", tenant=t)
    scraped = [""]

    def counted() -> dict[tuple[str, str], float] | None:  # the metrics follow the feed
        scraped[0] = text = http.get("/metrics", headers=server.as_(admin)).text
        found = {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
            r'pending_actions_policy_total\{event="(\w+)",rule="([\w-]+)",tenant="[^"]+"\} '
            r"(\S+)", text)}
        if found.get(("denied", "no-rm")) == 2 and found.get(("approved", "two")) == 1:
            return found
        return None

    found = wait_until(counted, 20, lambda: f"the policy metrics: {scraped[0]}", interval_s=0.2)
    assert found.get(("asked", "two")) == 1
