"""The approval boundary (issue 37, docs/policies.md): nothing a producer, a model, an edit or a
name does sidesteps what a tenant's policy decided. Against a real Redis (one server and the
test cluster) and real workers.

A handler runs only through a lease, and a lease is written by two scripts only: take.lua (a
resolve: apply or discard, of an action, a directive or a standing handler, by the model or a
person) and stage.lua (an action its policy applies at once). Every way there is decided by
``Policy.decide`` (both handlers) at stage or at ``set_slot``, again at an edit, and enforced by
take.lua; ``PATHS`` names each way and the test that shows it, and
``test_every_lease_is_written_by_the_paths_named`` fails when a script starts writing leases
that is not one of them."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

import pending_actions
from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.models import ResolveRequest, Result
from pending_actions.broker.routing import heartbeat
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.conftest import Deployment, both
from tests.support.faults import K, wait_history
from tests.support.replies import entries
from tests.support.runs import runs
from tests.support.unchanged import live, redis_unchanged

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

SCRIPTS = Path(__file__).resolve().parent.parent / "broker" / "atomic" / "lua"

# every way a handler can come to run, and the test here that shows the policy decides it
PATHS = {
    "stage, the apply handler": "test_the_reject_handler_is_decided_too",
    "stage, the reject handler": "test_the_reject_handler_is_decided_too",
    "stage, auto-apply": "test_auto_stands_only_when_the_reject_handler_asks_no_more",
    "resolve apply by the model": "test_the_reject_handler_is_decided_too",
    "resolve discard by the model (reject handler)": "test_the_models_discard_needs_people",
    "resolve discard by people (reject handler)": "test_people_discard_with_the_approvals",
    "resolve apply with an edit": "test_an_edit_is_decided_again",
    "a directive or standing handler (either handler)": "test_a_slot_is_decided_with_both",
}

POLICY = {"default": "allow", "rules": [
    {"name": "writes", "match": {"apply": "t.reject_*"}, "decision": "ask", "approvals": 2,
     "reason": "writes need two people"},
    {"name": "no-raise", "match": {"apply": "t.reject_raise"}, "decision": "deny",
     "reason": "that handler is off limits"},
    {"name": "dev", "match": {"tool": "migrate", "payload": {"env": "dev"}}, "decision": "ask"},
    {"name": "prod", "match": {"tool": "migrate", "payload": {"env": "prod"}}, "decision": "ask",
     "approvals": 3},
    {"name": "drops", "match": {"tool": "migrate", "payload": {"drop_db": True}},
     "decision": "deny", "reason": "never drop"},
    {"name": "reads", "match": {"tool": "read_*"}, "decision": "allow", "auto": True},
]}


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


@pytest.fixture
def tenant(pa: PendingActions) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    pa.set_policy(POLICY, tenant=name, by="test")
    return name


def events(rc: redis.Redis, session: str) -> list[str]:
    return [f[b"event"].decode() for _e, f in entries(rc.xrange(K.history(session)))]


def test_every_lease_is_written_by_the_paths_named() -> None:
    """A script that makes a new lease (a table of an attempt: its action's id, kind and token;
    begin, renew and unclaim change one that exists) is a path to a handler: only take.lua and
    stage.lua do, and PATHS names their ways."""
    creates = sorted(p.stem for p in SCRIPTS.glob("*.lua")
                     if re.search(r"\{\s*id = id, kind = [^}]*token = token", p.read_text()))
    assert creates == ["stage", "take"]
    assert set(PATHS.values()) <= {name for name in globals() if name.startswith("test_")}


def test_the_reject_handler_is_decided_too(pa: PendingActions, rc: redis.Redis, session: str,
                                           tenant: str) -> None:
    # the apply handler alone would be allowed: the reject handler asks two people
    action_id = pa.stage(session=session, tool="write_file", label="W", apply="t.ok",
                         reject="t.reject_text", payload={"path": "a"}, tenant=tenant)
    [shown] = pa.pending(session)
    assert shown.policy is not None
    assert (shown.policy["decision"], shown.policy["rule"], shown.policy["approvals"]) == (
        "ask", "writes", 2)
    with redis_unchanged(rc):
        refused = pa.resolve(session=session, action="apply", reason="model")
    assert refused.is_error and refused.text.startswith("Needs approval:"), refused.text
    assert [a.id for a in pa.pending(session)] == [action_id]
    # a deny on the reject handler denies the stage, whatever the apply handler is
    with pytest.raises(pending_actions.Denied) as caught:
        pa.stage(session=session, tool="harmless", label="H", apply="t.ok",
                 reject="t.reject_raise", tenant=tenant)
    assert caught.value.rule == "no-raise"
    assert [a.id for a in pa.pending(session)] == [action_id]
    assert events(rc, session) == ["staged", "denied"]
    assert runs(rc, session) == []


def test_auto_stands_only_when_the_reject_handler_asks_no_more(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    pa.stage(session=session, tool="read_file", label="R", apply="t.ok", reject="t.reject_text",
             tenant=tenant)
    [shown] = pa.pending(session)
    assert shown.policy is not None and shown.policy["decision"] == "ask"
    assert "auto" not in shown.policy
    auto = pa.stage(session=session, tool="read_file", label="R2", apply="t.ok", tenant=tenant)
    applied = wait_history(rc, session, "applied")
    assert applied[b"id"] == auto.encode() and applied[b"by"] == b"policy:reads"
    assert [r["id"] for r in runs(rc, session)] == [auto]


def test_the_models_discard_needs_people(pa: PendingActions, rc: redis.Redis, session: str,
                                         tenant: str) -> None:
    pa.stage(session=session, tool="write_file", label="W", apply="t.ok",
             reject="t.reject_text", tenant=tenant)
    with redis_unchanged(rc):
        refused = pa.resolve(session=session, action="discard", reason="model")
    assert refused.is_error and refused.text.startswith("Needs approval:"), refused.text
    assert "reject handler" in refused.text and "you may discard" not in refused.text
    assert runs(rc, session) == []
    # without a reject handler, an ask action is the model's to discard: nothing runs
    plain = pa.stage(session=session, tool="migrate", label="M", apply="t.ok",
                     payload={"env": "dev"}, tenant=tenant)
    done = pa.resolve(session=session, action="discard", reason="not now")
    assert not done.is_error and done.text.startswith("Discarded: M"), done.text
    assert plain not in [a.id for a in pa.pending(session)]
    assert runs(rc, session) == []


def test_people_discard_with_the_approvals(pa: PendingActions, rc: redis.Redis, session: str,
                                           tenant: str) -> None:
    action_id = pa.stage(session=session, tool="write_file", label="W", apply="t.ok",
                         reject="t.reject_text", tenant=tenant)
    # an approval of the apply counts nothing for a discard: people approve one verb at a time
    first = pa.resolve(session=session, action="apply", reason="ok", approver="alice")
    assert first.text.startswith("Approved 1 of 2"), first.text
    one = pa.resolve(session=session, action="discard", reason="no", approver="bob")
    assert one.text.startswith("Approved 1 of 2") and "discarded" in one.text, one.text
    [shown] = pa.pending(session)
    assert (shown.approved_by, shown.approving) == (["bob"], "discard")
    two = pa.resolve(session=session, action="discard", reason="no", approver="carol")
    assert not two.is_error and two.text.startswith("rejected W"), two.text
    assert [(r["handler"], r["id"]) for r in runs(rc, session)] == [("t.reject_text", action_id)]
    assert pa.pending(session) == []


def test_an_edit_is_decided_again(pa: PendingActions, rc: redis.Redis, session: str,
                                  tenant: str) -> None:
    action_id = pa.stage(session=session, tool="migrate", label="Migrate", apply="t.ok",
                         payload={"env": "dev"}, tenant=tenant)
    for edit, rule in (({"env": "prod"}, "prod"), ({"drop_db": True}, "drops")):
        with redis_unchanged(rc), pytest.raises(InvalidInput) as caught:
            pa.resolve(session=session, action="apply", reason="r", approver="alice",
                       edit=edit)
        assert caught.value.field == "edit" and rule in str(caught.value), caught.value
    # a trusted runtime's edit (no approver) of the same action: decided the same way
    with redis_unchanged(rc), pytest.raises(InvalidInput) as caught:
        pa.resolve(session=session, action="apply", reason="r", edit={"drop_db": True})
    assert caught.value.field == "edit"
    assert runs(rc, session) == []
    # an edit that asks no more than the staged action goes through, and is what runs
    done = pa.resolve(session=session, action="apply", reason="r", approver="alice",
                      edit={"note": "checked"})
    assert not done.is_error, done.text
    [run] = runs(rc, session)
    assert run["id"] == action_id and run["payload"] == {"env": "dev", "note": "checked"}


def test_an_allowed_action_edited_into_a_denied_one_is_refused(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    pa.stage(session=session, tool="migrate", label="Migrate", apply="t.ok",
             payload={"env": "test"}, tenant=tenant)
    with redis_unchanged(rc), pytest.raises(InvalidInput) as caught:
        pa.resolve(session=session, action="apply", reason="r", edit={"drop_db": True})
    assert caught.value.field == "edit" and "deny" in str(caught.value)
    assert runs(rc, session) == []


def test_a_slot_is_decided_with_both(tmp_path: Path, session: str) -> None:
    # slots are the default tenant's: its policy is set on a Redis of this test's own (a
    # policy cannot be taken back, and the suite's other tests stage as the default tenant)
    server = EmbeddedRedis(directory=tmp_path).start()
    pa = PendingActions.from_url(server.url)
    try:
        heartbeat(pa.client, K, "slots", ["t.ok", "t.reject_text"], "i1", 60_000)
        pa.set_policy({"default": "allow", "rules": [
            {"name": "writes", "match": {"apply": "t.reject_*"}, "decision": "ask"}]})
        with redis_unchanged(pa.client):
            for setter in (pa.set_directive, pa.set_standing):
                with pytest.raises(pending_actions.Denied):
                    setter(session, tool="plan", label="P", apply="t.ok",
                           reject="t.reject_text")
        assert pa.next_tool_choice(session) is None
        pa.set_directive(session, tool="plan", label="P", apply="t.ok")  # both allowed
        assert pa.next_tool_choice(session) is not None
    finally:
        pa.close()
        server.stop()


def test_one_person_counts_once_whatever_the_spelling(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    pa.stage(session=session, tool="write_file", label="W", apply="t.ok",
             reject="t.reject_text", tenant=tenant)
    answers = [pa.resolve(session=session, action="apply", reason="r", approver=name)
               for name in ("alice", "Alice", " ALICE ", "\uff41lice")]
    assert [a.text.split(".")[0] for a in answers] == ["Approved 1 of 2: alice"] * 4
    assert [a.approved_by for a in pa.pending(session)] == [["alice"]]
    assert runs(rc, session) == []
    with pytest.raises(InvalidInput) as caught:
        pa.resolve(session=session, action="apply", reason="r", approver="al ice")
    assert caught.value.field == "approver"


def test_a_session_holds_at_most_max_pending(deployment: Deployment, rc: redis.Redis,
                                             session: str) -> None:
    pa = PendingActions.from_url(deployment.url, max_pending_per_session=3)
    try:
        for n in range(3):
            pa.stage(session=session, tool="edit", label=f"E{n}", apply="t.ok")
        with redis_unchanged(rc), pytest.raises(InvalidInput) as caught:
            pa.stage(session=session, tool="edit", label="E3", apply="t.ok")
        assert "MAX_PENDING_PER_SESSION" in str(caught.value) and "3" in str(caught.value)
        # a batch over several sessions, one of which is full: none of it is staged
        other = f"{session}-b"
        batch: list[dict[str, Any]] = [
            {"session": other, "tool": "edit", "label": "B", "apply": "t.ok"},
            {"session": session, "tool": "edit", "label": "E3", "apply": "t.ok"}]
        with redis_unchanged(rc), pytest.raises(InvalidInput):
            pa.stage_many(batch)
        assert len(pa.pending(session)) == 3 and pa.pending(other) == []
        # a resolve makes room
        assert not pa.resolve(session=session, action="discard", reason="r").is_error
        pa.stage(session=session, tool="edit", label="E3", apply="t.ok")
        assert len(pa.pending(session)) == 3
    finally:
        pa.close()


def test_a_tenants_resolve_finds_nothing_in_another_tenants_session(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    """Checked in the step that takes (serve and the MCP servers say whose resolve it is): a
    session another tenant claimed a moment before the caller's own check answers as one that
    does not exist, and nothing of it changes."""
    theirs = pa.stage(session=session, tool="edit", label="secret", apply="t.ok",
                      payload={"secret": 1}, tenant="beta")
    missing = f"{session}-none"

    def own(key: bytes) -> bool:  # the request's own marker is written for a missing one too
        return b":req:" in key or b":reply:" in key or live()(key)

    for action in ("apply", "discard"):
        want = pa.resolve(session=missing, action=action, reason="r", tenant="acme")
        with redis_unchanged(rc, ignore=own):
            got = pa.resolve(session=session, action=action, reason="r", tenant="acme")
        assert (got.text, got.is_error, got.details) == (want.text, want.is_error,
                                                         want.details), got.text
    expect = pa.resolve(session=session, action="apply", reason="r", tenant="acme",
                        expect_id=theirs)
    assert expect.is_error and "expect_id" in expect.details
    assert [a.id for a in pa.pending(session)] == [theirs] and runs(rc, session) == []
    # its own tenant resolves it as ever
    done = pa.resolve(session=session, action="apply", reason="r", tenant="beta")
    assert not done.is_error and [r["id"] for r in runs(rc, session)] == [theirs]


def test_a_session_that_holds_a_slot_is_the_default_tenants(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    """A slot is the default tenant's: another tenant's stage never takes its session over
    (and with it, the slot's handler, applied by that tenant's model)."""
    pa.set_standing(session, tool="mode", label="M", apply="t.ok")
    with redis_unchanged(rc), pytest.raises(pending_actions.Forbidden):
        pa.stage(session=session, tool="edit", label="E", apply="t.ok", tenant="beta")
    assert pa.tenant_of(session) == "default"
    got = pa.resolve(session=session, action="apply", reason="r", tenant="beta")
    assert got.text == pa.resolve(session=f"{session}-none", action="apply", reason="r",
                                  tenant="beta").text
    assert runs(rc, session) == []


def test_a_payload_key_named_like_a_field_is_payload(pa: PendingActions, rc: redis.Redis,
                                                     session: str, tenant: str) -> None:
    """take.lua reads a spec's handlers and policy from the spec's own fields only: a payload
    key "reject" (a model's arguments through mcp-proxy) is no reject handler, and a schema's
    "policy" no decision."""
    pa.stage(session=session, tool="migrate", label="M", apply="t.ok",
             payload={"env": "dev", "reject": "t.reject_raise"}, tenant=tenant)
    done = pa.resolve(session=session, action="discard", reason="not now")
    assert not done.is_error and done.text.startswith("Discarded: M"), done.text
    # no policy and no payload (so no payload field in the spec): the schema comes after the
    # spec's own fields, and its keys are no decision
    plain = f"{session}-plain"
    pa.stage(session=plain, tool="edit", label="E", apply="t.ok",
             schema={"type": "object", "policy": {"decision": "ask", "approvals": 3}})
    applied = pa.resolve(session=plain, action="apply", reason="r")
    assert not applied.is_error, applied.text
    assert [r["handler"] for r in runs(rc, plain)] == ["t.ok"] and runs(rc, session) == []


def test_the_pending_cap_counts_what_is_in_flight_and_applied_at_once(
        deployment: Deployment, rc: redis.Redis, session: str, tenant: str) -> None:
    pa = PendingActions.from_url(deployment.url, max_pending_per_session=3)
    gate = f"gate-{session}"
    try:
        # three applied at once, held running: the session holds three
        for n in range(3):
            pa.stage(session=session, tool="read_file", label=f"R{n}", apply="t.gate",
                     payload={"gate": gate}, tenant=tenant)
        for _n in range(3):
            assert rc.blpop([f"test:started:{session}"], timeout=20) is not None
        with redis_unchanged(rc, ignore=lambda k: b"test:" in k or live()(k)), \
                pytest.raises(InvalidInput) as caught:
            pa.stage(session=session, tool="read_file", label="R3", apply="t.gate",
                     payload={"gate": gate}, tenant=tenant)
        assert "holds 3" in str(caught.value), caught.value
    finally:
        rc.rpush(gate, *["open"] * 3)
        pa.close()


def test_an_edit_decided_by_a_policy_that_changed_is_refused(
        pa: PendingActions, rc: redis.Redis, session: str, tenant: str) -> None:
    """The edit's request names the version it was decided by; a take under another changes
    nothing and says so (a request built here, as a client that decided before the change
    would have sent it)."""
    action_id = pa.stage(session=session, tool="migrate", label="M", apply="t.ok",
                         payload={"env": "dev"}, tenant=tenant)
    pa.set_policy(POLICY, tenant=tenant)  # version 2 in force
    req = uuid.uuid4().hex
    request = ResolveRequest.encode(req, session, "apply", "r", None, 20_000,
                                    int(time.time() * 1000) + 20_000, action_id, "alice",
                                    {"note": "x"}, None, "alice", 0,
                                    orjson.dumps({"note": "x"}).decode(), None, None,
                                    (tenant, "1"))
    with redis_unchanged(rc, ignore=lambda k: b":reply:" in k or live()(k)):
        rc.xadd(K.requests(K.partition(session)), {ResolveRequest.FIELD: request})
        got = rc.blpop([K.reply(session, req)], timeout=20)
    assert got is not None
    result = Result.model_validate_json(got[1])
    assert result.is_error and result.text.startswith("edit: the tenant's policy changed"), \
        result.text
    assert [a.id for a in pa.pending(session)] == [action_id] and runs(rc, session) == []
    # decided now, by the version in force, it goes through
    assert not pa.resolve(session=session, action="apply", reason="r", approver="alice",
                          edit={"note": "x"}).is_error
