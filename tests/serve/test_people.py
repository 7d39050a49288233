"""People are identities (issue 37), through the real ``serve`` process, Redis (one server and
the test cluster) and worker: a token name is a person's name, compared NFKC-folded (``Alice``
and ``alice`` cannot both hold a token), and an approval given through a token that is revoked
before the action applies no longer counts: not toward the approvals, not in the inbox."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from pending_actions.broker.errors import InvalidInput
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.conftest import Deployment
from tests.serve.conftest import Server
from tests.support.runs import runs
from tests.support.unchanged import redis_unchanged

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

POLICY = {"default": "allow", "rules": [
    {"name": "two", "match": {"tool": "deploy"}, "decision": "ask", "approvals": 2}]}


@pytest.fixture(scope="module")
def cluster_server(clustered: Deployment) -> Iterator[Server]:
    s = Server(clustered.url).wait_ready()
    yield s
    s.stop()


@pytest.fixture(params=["single", "cluster"])
def on(request: pytest.FixtureRequest) -> tuple[Server, PendingActions, Tokens]:
    if request.param == "single":
        server: Server = request.getfixturevalue("server")
        return server, request.getfixturevalue("pa"), request.getfixturevalue("tokens")
    deployment: Deployment = request.getfixturevalue("clustered")
    return (request.getfixturevalue("cluster_server"), deployment.pa,
            Tokens(deployment.pa.client, deployment.pa.ctx.keys))


def text(response: object) -> str:
    return str(response.json()["content"][0]["text"])  # type: ignore[attr-defined]


def test_a_token_name_is_a_persons_name(on: tuple[Server, PendingActions, Tokens]) -> None:
    _server, pa, tokens = on
    name = f"Alice-{uuid.uuid4().hex[:4]}"
    _token, who = tokens.create("acme", "approver", name=name)
    assert who.name == name.lower()
    with redis_unchanged(pa.client), pytest.raises(InvalidInput) as caught:
        tokens.create("acme", "approver", name=f"  {name.upper()} ")
    assert caught.value.field == "name" and "exists" in str(caught.value)
    assert tokens.revoke(name.upper())  # the same person's token, however it is spelled


def test_a_revoked_tokens_approval_stops_counting(
        on: tuple[Server, PendingActions, Tokens]) -> None:
    server, pa, tokens = on
    t = f"t-{uuid.uuid4().hex[:8]}"
    pa.set_policy(POLICY, tenant=t)
    suffix = uuid.uuid4().hex[:4]
    alice, _ = tokens.create(t, "approver", name=f"alice-{suffix}")
    bob, _ = tokens.create(t, "approver", name=f"bob-{suffix}")
    carol, _ = tokens.create(t, "approver", name=f"carol-{suffix}")
    s = f"web-{uuid.uuid4().hex[:8]}"
    action_id = pa.stage(session=s, tool="deploy", label="Deploy", apply="t.ok", tenant=t)
    http, body = server.http, {"action": "apply", "reason": "ok"}
    first = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(alice), json=body)
    assert first.status_code == 200 and text(first).startswith("Approved 1 of 2"), first.text
    assert tokens.revoke(f"alice-{suffix}")
    # alice's approval is gone from what people see, and from what counts
    inbox = http.get("/v1/inbox", headers=server.as_(bob)).json()["actions"]
    assert [a["approved_by"] for a in inbox] == [[]]
    second = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(bob), json=body)
    assert second.status_code == 200 and text(second).startswith(
        f"Approved 1 of 2: bob-{suffix}."), second.text
    assert runs(pa.client, s) == []
    # her token answers nothing any more; a third person's approval applies it, once
    again = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(alice), json=body)
    assert again.status_code == 401
    third = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(carol), json=body)
    assert third.status_code == 200 and text(third) == f"applied {action_id}", third.text
    assert [r["id"] for r in runs(pa.client, s)] == [action_id]


def test_an_approval_with_a_revoked_grant_is_refused(
        on: tuple[Server, PendingActions, Tokens]) -> None:
    """A token revoked between serve's look-up and the take (the grant reaches take.lua): it
    approves nothing, and nothing changes."""
    _server, pa, tokens = on
    t = f"t-{uuid.uuid4().hex[:8]}"
    pa.set_policy(POLICY, tenant=t)
    name = f"dave-{uuid.uuid4().hex[:4]}"
    _token, who = tokens.create(t, "approver", name=name)
    s = f"web-{uuid.uuid4().hex[:8]}"
    pa.stage(session=s, tool="deploy", label="Deploy", apply="t.ok", tenant=t)
    assert tokens.revoke(name)
    with redis_unchanged(pa.client):
        got = pa.resolve(session=s, action="apply", reason="ok", approver=who.name,
                         grant=who.grant)
    assert got.is_error and got.text.startswith("Needs approval:"), got.text
    assert [a.approved_by for a in pa.pending(s)] == [[]]
