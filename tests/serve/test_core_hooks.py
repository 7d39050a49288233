"""What serve builds on, through the Python client: tenants at stage, expect_id and by on
resolve."""

from __future__ import annotations

import uuid

import pytest

from pending_actions.broker.errors import Forbidden, InvalidInput
from pending_actions.producers import PendingActions
from tests.support.runs import runs


def new_session() -> str:
    return f"hook-{uuid.uuid4().hex[:10]}"


def test_expect_id_goes_through_only_for_the_target(pa: PendingActions) -> None:
    s = new_session()
    empty = pa.resolve(session=s, action="discard", reason="r", expect_id="pending-action:x:1")
    # not "Nothing to discard": the person expected something that is not there
    assert empty.is_error and empty.text.startswith("expect_id: pending-action:x:1 ")
    assert empty.details["expect_id"] == "pending-action:x:1"
    old = pa.stage(session=s, tool="edit", label="old", apply="t.ok")
    new = pa.stage(session=s, tool="edit", label="new", apply="t.ok")
    stale = pa.resolve(session=s, action="apply", reason="r", expect_id=old)
    assert stale.is_error and "expect_id" in stale.text
    assert [a.id for a in pa.pending(s)] == [new, old] and runs(pa.client, s) == []
    assert [e["event"] for e in pa.history(s)] == ["staged", "staged"]
    done = pa.resolve(session=s, action="apply", reason="r", expect_id=new, by="bob@example")
    assert done.text == f"applied {new}"
    events = [(e["event"], e.get("by")) for e in pa.history(s)]
    assert events[-2:] == [("taken", "bob@example"), ("applied", "bob@example")]
    plain = pa.resolve(session=s, action="discard", reason="r")  # neither: as before
    assert not plain.is_error and "by" not in pa.history(s)[-1]


def test_tenant_and_by_are_checked(pa: PendingActions) -> None:
    s, other = new_session(), new_session()
    with pytest.raises(InvalidInput) as bad:
        pa.stage(session=s, tool="edit", label="l", apply="t.ok", tenant="a b")
    assert bad.value.field == "tenant"
    with pytest.raises(InvalidInput) as bad:
        pa.resolve(session=s, action="apply", reason="r", by="no spaces please")
    assert bad.value.field == "by"
    pa.stage(session=s, tool="edit", label="l", apply="t.ok", tenant="red")
    # a batch touching another tenant's session stages nothing at all
    with pytest.raises(Forbidden):
        pa.stage_many([{"session": other, "tool": "edit", "label": "l", "apply": "t.ok",
                        "tenant": "blue"},
                       {"session": s, "tool": "edit", "label": "l", "apply": "t.ok",
                        "tenant": "blue"}])
    assert pa.pending(other) == [] and len(pa.pending(s)) == 1
    assert pa.pending(s)[0].tenant == "red"
    assert pa.tenant_of(s) == "red"
    assert pa.client.hget(pa.ctx.keys.sessions(pa.ctx.keys.partition(s)), s) == b"red"
    k = pa.ctx.keys
    assert pa.client.sismember(k.tenant_index(k.partition(s), "red"), s)
    # nor did the refused batch put either session in blue's index
    assert not pa.client.exists(k.tenant_index(k.partition(s), "blue"),
                                k.tenant_index(k.partition(other), "blue"))
