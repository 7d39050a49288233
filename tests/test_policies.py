"""Issue 31, policies and people, against a real Redis (one server and the test cluster) and a
real worker: deny with its reason (``Denied`` from ``pending_actions``), auto applied once by
nobody's resolve with ``by: policy:<rule>``, ask refusing the model and applying on people's
approvals (``by``), edits resetting approvals, revisions pinned, per-tenant scope, a stage
decided by an older version refused and decided again, a set stopped half way completed by
housekeeping; and refusals that leave Redis unchanged."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

import pending_actions
from pending_actions.broker.atomic.replies import Taken, TakeStatus
from pending_actions.broker.atomic.scripts import ToStage
from pending_actions.broker.errors import InvalidInput, PendingActionsError
from pending_actions.broker.keys import Keys
from pending_actions.broker.routing import LiveView, heartbeat
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.conftest import Deployment, both
from tests.support.faults import K, cluster, wait_history
from tests.support.replies import entries
from tests.support.runs import runs
from tests.support.unchanged import redis_unchanged
from tests.support.waits import wait_until

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

ASK2 = {"name": "two-people", "match": {"tool": "deploy"}, "decision": "ask", "approvals": 2,
        "reason": "deploys need two people"}
POLICY = {"default": "allow", "rules": [
    {"name": "no-prod-rm", "match": {"tool": "shell", "payload": {"cmd": "rm *", "env": "prod"}},
     "decision": "deny", "reason": "deleting in prod is not for agents"},
    ASK2,
    {"name": "one-person", "match": {"tool": "config"}, "decision": "ask"},
    {"name": "three-people", "match": {"tool": "launch"}, "decision": "ask", "approvals": 3},
    {"name": "reads", "match": {"tool": "read_*"}, "decision": "allow", "auto": True},
]}


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


@pytest.fixture
def tenant(pa: PendingActions) -> str:
    """A tenant of its own with POLICY: other tests' tenants never see it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    pa.set_policy(POLICY, tenant=name, by="test")
    return name


def history(rc: redis.Redis, session: str) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in f.items()}
            for _e, f in entries(rc.xrange(K.history(session)))]


def test_deny_raises_denied_with_the_reason_and_stages_nothing(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    with pytest.raises(pending_actions.Denied) as caught:
        pa.stage(session=session, tool="shell", label="clean up", apply="t.ok",
                 payload={"cmd": "rm -rf /data", "env": "prod"}, tenant=tenant)
    assert isinstance(caught.value, pending_actions.PendingActionsError)
    assert caught.value.reason == "deleting in prod is not for agents"
    assert caught.value.rule == "no-prod-rm"
    assert "deleting in prod is not for agents" in str(caught.value)
    assert pa.pending(session) == [] and pa.next_tool_choice(session) is None
    denied = [e for e in history(rc, session) if e["event"] == "denied"]
    assert [(e["rule"], e["reason"]) for e in denied] == [
        ("no-prod-rm", "deleting in prod is not for agents")]
    # a denied stage claimed the new session for its tenant (it wrote history there)
    assert pa.tenant_of(session) == tenant
    # the same payload elsewhere (another env, a path that is absent) is allowed
    pa.stage(session=session, tool="shell", label="clean up", apply="t.ok",
             payload={"cmd": "rm -rf /data", "env": "dev"}, tenant=tenant)
    pa.stage(session=session, tool="shell", label="clean up", apply="t.ok",
             payload={"cmd": "rm -rf /data"}, tenant=tenant)
    assert [(a.policy or {})["decision"] for a in pa.pending(session)] == ["allow", "allow"]


def test_a_batch_stages_what_is_allowed_and_names_what_was_denied(
        pa: PendingActions, session: str, tenant: str) -> None:
    base = {"session": session, "label": "L", "apply": "t.ok", "tenant": tenant}
    with pytest.raises(pending_actions.Denied) as caught:
        pa.stage_many([{**base, "tool": "edit"},
                       {**base, "tool": "shell", "payload": {"cmd": "rm x", "env": "prod"}},
                       {**base, "tool": "deploy"}])
    ids = caught.value.ids
    assert ids[1] is None and ids[0] and ids[2]
    assert [d["rule"] for d in caught.value.denied] == ["no-prod-rm"]
    assert [a.id for a in pa.pending(session)] == [ids[2], ids[0]]


def test_auto_is_applied_once_by_nobody_and_never_offered_to_the_model(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    action_id = pa.stage(session=session, tool="read_file", label="read a.py", apply="t.ok",
                         payload={"path": "a.py"}, tenant=tenant)
    assert pa.next_tool_choice(session) is None  # in flight, on no stack
    applied = wait_history(rc, session, "applied")
    assert applied[b"by"] == b"policy:reads" and applied[b"id"] == action_id.encode()
    taken = [e for e in history(rc, session) if e["event"] == "taken"]
    assert [(e["by"], e["attempt"]) for e in taken] == [("policy:reads", "1")]
    assert [r["id"] for r in runs(rc, session)] == [action_id]
    assert "reads" in runs(rc, session)[0]["reason"]
    assert pa.pending(session) == []
    nothing = pa.resolve(session=session, action="apply", reason="r")
    assert nothing.is_error and "No pending action" in nothing.text
    # (nothing more can come: the lease is gone, the request acked)
    assert len(runs(rc, session)) == 1


def test_ask_refuses_the_model_and_applies_on_two_peoples_approval(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    action_id = pa.stage(session=session, tool="deploy", label="Deploy api", apply="t.ok",
                         tenant=tenant)
    [shown] = pa.pending(session)
    assert shown.policy == {"rule": "two-people", "decision": "ask", "version": 1,
                            "approvals": 2}
    assert shown.approved_by == []
    staged = [e for e in history(rc, session) if e["event"] == "staged"]
    assert (staged[0]["decision"], staged[0]["rule"], staged[0]["approvals"]) == (
        "ask", "two-people", "2")
    with redis_unchanged(rc):
        held = pa.resolve(session=session, action="apply", reason="ship it")
    assert held.is_error and held.text.startswith("Needs approval:")
    assert "2 more approval(s) of 2" in held.text and "two-people" in held.text
    assert pa.next_tool_choice(session) is not None  # still the head, nothing ran
    first = pa.resolve(session=session, action="apply", reason="ok", approver="alice")
    assert not first.is_error and first.text.startswith("Approved 1 of 2"), first.text
    again = pa.resolve(session=session, action="apply", reason="ok", approver="alice")
    assert again.text.startswith("Approved 1 of 2") and "alice had approved already" in again.text
    assert pa.pending(session)[0].approved_by == ["alice"]
    assert runs(rc, session) == []
    done = pa.resolve(session=session, action="apply", reason="ok", approver="bob")
    assert not done.is_error and done.text == f"applied {action_id}"
    assert len(runs(rc, session)) == 1
    events = history(rc, session)
    approved = [e for e in events if e["event"] == "approved"]
    assert [(e["by"], e["approvals"]) for e in approved] == [("alice", "1/2")]
    taken = [e for e in events if e["event"] == "taken"]
    assert (taken[-1]["approved_by"], taken[-1]["by"]) == ("alice,bob", "bob")
    assert [e["by"] for e in events if e["event"] == "applied"] == ["bob"]


def test_a_second_approval_by_the_same_person_counts_once(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    pa.stage(session=session, tool="launch", label="Launch", apply="t.ok", tenant=tenant)
    for name, said in (("alice", "Approved 1 of 3: alice."),
                       ("bob", "Approved 2 of 3: alice, bob."),
                       ("alice", "Approved 2 of 3: alice, bob. alice had approved already.")):
        got = pa.resolve(session=session, action="apply", reason="ok", approver=name)
        assert got.text.startswith(said), got.text
    assert [e["by"] for e in history(rc, session) if e["event"] == "approved"] == ["alice", "bob"]
    assert pa.resolve(session=session, action="apply", reason="ok",
                      approver="carol").text.startswith("applied")


def test_the_model_may_discard_what_it_may_not_apply(
        pa: PendingActions, session: str, tenant: str) -> None:
    pa.stage(session=session, tool="config", label="Set a flag", apply="t.ok", tenant=tenant)
    done = pa.resolve(session=session, action="discard", reason="withdrawn")
    assert not done.is_error and done.text.startswith("Discarded: Set a flag")
    assert pa.pending(session) == []


@pytest.mark.parametrize("sneaked", [{"approver": "alice"}, {"by": "policy:reads"},
                                     {"edit": {"replicas": 9}}, {"revision": 0}])
def test_the_models_tool_call_cannot_carry_what_only_trusted_code_may(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str,
        sneaked: dict[str, Any]) -> None:
    """The tool call's arguments as the model sent them (``resolve_tool_call``, what the agent
    loop and the MCP server use): a key beside action, reason and extra is refused naming it,
    before anything is sent; two such calls never make two people."""
    action_id = pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok",
                         payload={"replicas": 2}, tenant=tenant)
    [field] = sneaked
    for _twice in range(2):
        with redis_unchanged(rc), pytest.raises(InvalidInput, match=f"invalid {field}: not an "
                                                "argument of resolve"):
            pa.resolve_tool_call(session=session, arguments={"action": "apply", "reason": "go",
                                                             **sneaked})
    refused = pa.resolve_tool_call(session=session, arguments={"action": "apply",
                                                               "reason": "go"})
    assert refused.is_error and refused.text.startswith("Needs approval:"), refused.text
    assert "approver=" not in refused.text  # the model is not told how a runtime approves
    [shown] = pa.pending(session)
    assert (shown.id, shown.approved_by, shown.payload) == (action_id, [], {"replicas": 2})
    assert not [e for e in history(rc, session) if e["event"] in ("approved", "applied")]


def test_an_edit_resets_the_approvals_and_a_revision_is_pinned(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    action_id = pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok",
                         payload={"replicas": 2, "image": "api:1"}, tenant=tenant)
    assert pa.resolve(session=session, action="apply", reason="ok",
                      approver="alice").text.startswith("Approved 1 of 2")
    edited = pa.resolve(session=session, action="apply", reason="fewer", approver="bob",
                        edit={"replicas": 1})
    assert edited.text.startswith("Approved 1 of 2: bob"), edited.text
    [shown] = pa.pending(session)
    assert (shown.payload, shown.revision, shown.approved_by, shown.edited) == (
        {"replicas": 1, "image": "api:1"}, 1, ["bob"], True)
    # alice's click on what she saw before is refused, nothing changes
    with redis_unchanged(rc):
        late = pa.resolve(session=session, action="apply", reason="ok", approver="alice",
                          expect_id=action_id, revision=0)
    assert late.is_error and late.text.startswith("revision:"), late.text
    done = pa.resolve(session=session, action="apply", reason="ok", approver="alice",
                      expect_id=action_id, revision=1)
    assert done.text == f"applied {action_id}"
    [ran] = runs(rc, session)
    assert ran["payload"] == {"replicas": 1, "image": "api:1"}
    applied = wait_history(rc, session, "applied")
    assert orjson.loads(applied[b"edit"]) == {"replicas": 1}
    assert orjson.loads(applied[b"payload"]) == {"replicas": 2, "image": "api:1"}


def test_a_policy_is_the_tenants_own(pa: PendingActions, session: str, tenant: str) -> None:
    other = f"o-{uuid.uuid4().hex[:8]}"
    pa.stage(session=session, tool="deploy", label="D", apply="t.ok", tenant=other)
    assert pa.pending(session)[0].policy is None
    assert not pa.resolve(session=session, action="apply", reason="r").is_error
    assert pa.get_policy(other) is None
    got = pa.get_policy(tenant)
    assert got is not None and got["document"] == POLICY and got["by"] == "test"


def test_a_stage_decided_by_an_older_version_is_refused_and_decided_again(
        deployment: Deployment, session: str, tenant: str) -> None:
    """A second client changes the policy: the first, which decided by version 1, is refused
    by stage.lua (nothing changed), reads version 2 and stages by it, in the same call."""
    pa, rc = deployment.pa, deployment.rc
    pa.stage(session=session, tool="deploy", label="D1", apply="t.ok", tenant=tenant)
    other = PendingActions.from_url(deployment.url)
    try:
        assert other.set_policy({"rules": [{"name": "all-deny", "match": {"tool": "deploy"},
                                            "decision": "deny", "reason": "frozen"}]},
                                tenant=tenant) == 2
    finally:
        other.close()
    p = K.partition(session)
    old = pa.ctx.scripts.stage(session, tenant=tenant, indexed=True, at="1.000",
                               actions=[ToStage("pending-action:deploy:999999999",
                                                b'{"label":"x","apply":"t.ok"}', None,
                                                "1.000", "ask", "two-people", "2")],
                               policy_version="1")
    with redis_unchanged(rc):
        refused = old.run()
    assert (refused.refused is not None, refused.version) == (True, "2"), refused
    assert rc.hget(K.policy_markers(p), tenant) == b"2"
    with pytest.raises(pending_actions.Denied, match="frozen"):
        pa.stage(session=session, tool="deploy", label="D2", apply="t.ok", tenant=tenant)
    assert len(pa.pending(session)) == 1


def test_a_set_stopped_half_way_is_completed_by_housekeeping(
        deployment: Deployment, session: str) -> None:
    """set_policy.lua ran, no marker was raised (the setter died): stages go on by the
    marker's version until a resolve worker's housekeeping raises it."""
    pa, rc = deployment.pa, deployment.rc
    tenant = f"h-{uuid.uuid4().hex[:8]}"
    version = pa.ctx.scripts.set_policy(tenant, rest=b',"set_at":1,"by":null,"document":'
                                        + orjson.dumps({"default": "deny", "rules": []})
                                        + b"}").run()
    assert version == 1
    first = pa.stage(session=session, tool="edit", label="before", apply="t.ok", tenant=tenant)
    assert pa.pending(session)[0].policy is None and pa.pending(session)[0].id == first
    wait_until(lambda: rc.hget(K.policy_markers(K.partition(session)), tenant) == b"1",
               30, "housekeeping raising the marker", interval_s=0.2)  # HOUSEKEEPING_S: 10 s
    with pytest.raises(pending_actions.Denied):
        pa.stage(session=session, tool="edit", label="after", apply="t.ok", tenant=tenant)


def test_a_bad_policy_is_one_error_naming_the_rule_and_the_field(
        pa: PendingActions, tenant: str) -> None:
    bad: list[tuple[Any, str]] = [
        ({"rules": [{"name": "x", "match": {"tool": "a"}, "decision": "allow",
                     "approvals": 2}]}, "rules[0].approvals"),
        ({"rules": [{"name": "x", "match": {"tool": "[a-"}, "decision": "ask"}]},
         "rules[0].match.tool"),
        ({"rules": [{"name": "x", "match": {}, "decision": "maybe"}]}, "rules[0].decision"),
        ({"rules": [{"name": "x", "match": {}, "decision": "deny", "auto": True}]},
         "rules[0].auto"),
        ({"rules": [{"name": "x", "match": {"tools": "a"}, "decision": "deny"}]},
         "rules[0].match.tools"),
        ({"rules": [], "defualt": "deny"}, "defualt"),
    ]
    for document, field in bad:
        with pytest.raises(InvalidInput) as caught:
            pa.set_policy(document, tenant=tenant)
        assert caught.value.field == field, caught.value
        if field.startswith("rules[0]") and field != "rules[0].decision":
            assert "rule 'x'" in str(caught.value)
        assert len(str(caught.value).splitlines()) == 1
    got = pa.get_policy(tenant)
    assert got is not None and got["version"] == 1  # the old one stays


def test_keys_of_policies() -> None:
    k = Keys("pa", 16)
    assert k.policy("acme") == "pa-policy:{policies}:t:acme"
    assert k.policy_index == "pa-policy:{policies}:index"
    assert k.policy_markers(3).endswith("}:policies")
    with pytest.raises(PendingActionsError):
        raise pending_actions.Denied("r", None)


def test_a_denied_or_auto_stage_sent_again_records_nothing_twice(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    """stage.lua sent twice with the same arguments (a retry after a lost reply): a denied
    action is recorded denied once (its denial marker), an auto one applied once (its request's
    marker): the second call changes nothing at all."""
    pa.stage(session=session, tool="edit", label="warm", apply="t.ok", tenant=tenant)
    core = pa.core
    for tool, payload, outcome in (("shell", {"cmd": "rm x", "env": "prod"}, "denied"),
                                   ("read_file", {}, "applied")):
        fields = core.validate(session, "action", tool, "L", "t.ok", None, payload,
                               tenant=tenant)
        spec = core._spec(fields, f"pending-action:{tool}:{uuid.uuid4().int % 10**12 * 16}",
                          None)
        call = core._call([spec])
        assert call.run().depths == [1]
        wait_history(rc, session, outcome)
        with redis_unchanged(rc):
            assert call.run().depths == [0]
    assert [e["event"] for e in history(rc, session)].count("denied") == 1
    assert len([r for r in runs(rc, session)
                if r["id"].startswith("pending-action:read_file")]) == 1


def test_the_asyncio_client_sets_reads_and_stages_by_policies(
        deployment: Deployment, session: str) -> None:
    import asyncio

    from pending_actions.producers import AsyncPendingActions

    tenant = f"a-{uuid.uuid4().hex[:8]}"

    async def body() -> None:
        async with AsyncPendingActions.from_url(deployment.url, resolve_timeout_s=30) as apa:
            assert await apa.set_policy(POLICY, tenant=tenant) == 1
            got = await apa.get_policy(tenant)
            assert got is not None and got["document"] == POLICY
            verdict = await apa.decide(session=session, tool="deploy", apply="t.ok", label="D",
                                       payload={}, tenant=tenant)
            assert verdict is not None and (verdict.decision, verdict.rule) == ("ask",
                                                                                "two-people")
            with pytest.raises(pending_actions.Denied):
                await apa.stage(session=session, tool="shell", label="x", apply="t.ok",
                                payload={"cmd": "rm a", "env": "prod"}, tenant=tenant)
            await apa.stage(session=session, tool="deploy", label="D", apply="t.ok",
                            tenant=tenant)
            held = await apa.resolve(session=session, action="apply", reason="r")
            assert held.text.startswith("Needs approval:")
            with pytest.raises(InvalidInput, match="invalid approver"):
                await apa.resolve_tool_call(session=session, arguments={
                    "action": "apply", "reason": "r", "approver": "mallory"})
            held = await apa.resolve_tool_call(session=session, arguments={
                "action": "apply", "reason": "r"})
            assert held.text.startswith("Needs approval:")
            first = await apa.resolve(session=session, action="apply", reason="r",
                                      approver="alice")
            assert first.text.startswith("Approved 1 of 2")

    asyncio.run(body())


def test_a_slot_the_policy_keeps_from_the_model_is_not_set(tmp_path: Path) -> None:
    """The model's own resolve applies a directive or standing handler, so one the (default)
    tenant's policy denies, or asks people for, is refused when it is set (``Denied``, nothing
    written); an allowed one is set as before. On a Redis of its own: the default tenant's
    policy would decide every other test's stages."""
    with cluster(tmp_path, fsync="everysec") as (server, _workers, pa):
        rc = redis.Redis.from_url(server.url)
        pa.set_policy(POLICY, by="test")
        for set_slot in (pa.set_directive, pa.set_standing):
            with redis_unchanged(rc), pytest.raises(pending_actions.Denied) as asked:
                set_slot("slots", tool="deploy", label="Deploy", apply="t.ok")
            assert asked.value.rule == "two-people" and "stage it as an action" in str(
                asked.value)
        pa.set_policy({**POLICY, "default": "deny"}, by="test")
        for set_slot in (pa.set_directive, pa.set_standing):
            with redis_unchanged(rc), pytest.raises(pending_actions.Denied) as denied:
                set_slot("slots", tool="edit", label="Edit", apply="t.ok")
            assert denied.value.rule is None and "(the policy's default)" in str(denied.value)
        pa.set_policy(POLICY, by="test")
        pa.set_directive("slots", tool="edit", label="Edit", apply="t.ok")
        done = pa.resolve(session="slots", action="apply", reason="r")
        assert not done.is_error and done.details["label"] == "Edit", done.text


def test_an_approval_is_recorded_only_while_it_is_still_not_the_last(
        redis_server: EmbeddedRedis) -> None:
    """take.lua only counts an approval that is not the last one needed (COUNTED, nothing
    written); approve.lua records it while the action is as that take saw it, and else changes
    nothing (RETAKE): of three people whose takes all counted the first of two approvals, one
    records it; the second takes again and, the last one now, takes the action; the third's is
    not recorded either (the action is gone from where its take saw it). Driven by
    hand: a pool with the handler is made live, and no worker serves this prefix."""
    prefix, session, tenant = f"ap{uuid.uuid4().hex[:6]}", "s1", f"t-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    rc = redis.Redis.from_url(redis_server.url)
    heartbeat(rc, keys, "p", ["t.ok"], "by-hand", 60_000)
    pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
    scripts = pa.ctx.scripts
    try:
        pa.set_policy({"rules": [ASK2]}, tenant=tenant, by="test")
        action_id = pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok",
                             tenant=tenant)
        live = LiveView(rc, keys).get()

        def take(req: str, approver: str) -> Taken:
            return scripts.take(session, req=req, action="apply", token=uuid.uuid4().hex,
                                reason="r", extra=b"null", marker_ttl_s=60, none_reply=b"{}",
                                live=live, message=None, approver=approver).run()

        def approve(req: str, approver: str, counted: Taken) -> Taken:
            return scripts.approve(session, counted=counted, req=req, action="apply",
                                   approver=approver, marker_ttl_s=60).run()

        def approvals() -> list[str]:
            return [f[b"by"].decode() for _e, f in entries(rc.xrange(keys.history(session)))
                    if f[b"event"] == b"approved"]

        alice, bob, carol = (take(f"r-{p}", p) for p in ("alice", "bob", "carol"))
        assert {alice.status, bob.status, carol.status} == {TakeStatus.COUNTED}
        assert rc.hget(keys.state(session), action_id) is None and approvals() == []
        got = approve("r-alice", "alice", alice)
        assert (got.status, got.recorded) == (TakeStatus.APPROVED, True)
        assert got.counters is not None and got.counters.approved_by == ["alice"]
        before = rc.hget(keys.state(session), action_id)
        # bob's take counted on counters that changed since: nothing recorded, take again
        assert approve("r-bob", "bob", bob).status is TakeStatus.RETAKE
        assert rc.hget(keys.state(session), action_id) == before
        assert approvals() == ["alice"] and rc.get(keys.request_marker(session, "r-bob")) is None
        taken = take("r-bob", "bob")
        assert (taken.status, taken.id) == (TakeStatus.OK, action_id)  # the last one
        # taken since carol's take counted her approval: not recorded
        assert approve("r-carol", "carol", carol).status is TakeStatus.RETAKE
        assert approvals() == ["alice"]
    finally:
        pa.close()
        rc.close()
