"""Issue 11 items 3 to 6 across real processes: stale previews, edit before apply, approving
exactly what was seen (expect_id), and the fixed semantics (a returned error result consumes,
next_tool_choice names only what pending() shows)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.errors import InvalidInput
from pending_actions.producers import PendingActions
from tests.support.runs import runs

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"content": {"type": "string"}, "mode": {"enum": ["a", "b"]}},
    "required": ["content"],
    "additionalProperties": False,
}


def events(pa: PendingActions, session: str) -> list[dict[str, str]]:
    return pa.history(session)


def test_stale_preview_is_consumed_with_a_stale_outcome(pa: PendingActions, rc: redis.Redis,
                                                        session: str) -> None:
    action_id = pa.stage(session=session, tool="edit", label="Edit a.py", apply="t.stale",
                         payload={"path": "a.py", "current": "sha-new"}, fingerprint="sha-old")
    assert pa.show(session, action_id).fingerprint == "sha-old"  # type: ignore[union-attr]
    res = pa.resolve(session=session, action="apply", reason="ship it")
    assert res.is_error and res.text.startswith("Stale: a.py changed since the preview")
    assert "Stage a new preview" in res.text
    assert pa.pending(session) == [] and pa.next_tool_choice(session) is None
    last = events(pa, session)[-1]
    assert (last["event"], last["id"]) == ("stale", action_id)
    assert last["error"].startswith("Stale:")
    # consumed: a second resolve finds nothing, the handler ran once
    assert pa.resolve(session=session, action="apply", reason="again").details.get("label") \
        is None
    assert len(runs(rc, session)) == 1


def test_fresh_fingerprint_applies(pa: PendingActions, session: str) -> None:
    pa.stage(session=session, tool="edit", label="Edit", apply="t.stale",
             payload={"current": "sha-1"}, fingerprint="sha-1")
    res = pa.resolve(session=session, action="apply", reason="ok")
    assert (res.is_error, res.text) == (False, "fresh")


def test_edit_before_apply(pa: PendingActions, session: str) -> None:
    action_id = pa.stage(session=session, tool="edit", label="Write", apply="t.seen",
                         payload={"content": "x", "mode": "a"}, schema=SCHEMA)
    res = pa.resolve(session=session, action="apply", reason="tweaked",
                     edit={"mode": "b", "content": "y"})
    assert not res.is_error
    seen = res.details["sourceResultDetails"]
    assert seen["payload"] == {"content": "y", "mode": "b"} and seen["edited"] is True
    assert res.details["edit"] == {"mode": "b", "content": "y"}
    applied = events(pa, session)[-1]
    assert (applied["event"], applied["id"]) == ("applied", action_id)
    assert applied["edit"] == '{"mode":"b","content":"y"}'
    assert applied["payload"] == '{"content":"x","mode":"a"}'  # the original, as staged


def test_edit_merge_patch_removes_with_null(pa: PendingActions, session: str) -> None:
    pa.stage(session=session, tool="edit", label="Write", apply="t.seen",
             payload={"content": "x", "mode": "a"}, schema=SCHEMA)
    res = pa.resolve(session=session, action="apply", reason="r", edit={"mode": None})
    assert res.details["sourceResultDetails"]["payload"] == {"content": "x"}


@pytest.mark.parametrize(("edit", "action", "field"), [
    ({"mode": "c"}, "apply", "edit"),  # against the schema
    ({"content": None}, "apply", "edit"),  # removes a required property
    ({"other": 1}, "apply", "edit"),  # additionalProperties: false
    ({"mode": "b"}, "discard", "edit"),  # only an apply edits
    (["not", "a", "patch"], "apply", "edit"),
])
def test_bad_edit_changes_nothing(pa: PendingActions, session: str, edit: Any, action: str,
                                  field: str) -> None:
    action_id = pa.stage(session=session, tool="edit", label="Write", apply="t.seen",
                         payload={"content": "x", "mode": "a"}, schema=SCHEMA)
    before = events(pa, session)
    with pytest.raises(InvalidInput) as err:
        pa.resolve(session=session, action=action, reason="r", edit=edit)
    assert err.value.field == field and "edit" in str(err.value)
    assert [a.id for a in pa.pending(session)] == [action_id]
    assert pa.pending(session)[0].attempts == 0
    assert events(pa, session) == before


def test_staging_checks_the_payload_and_the_schema(pa: PendingActions, session: str) -> None:
    with pytest.raises(InvalidInput) as err:
        pa.stage(session=session, tool="edit", label="W", apply="t.seen",
                 payload={"mode": "a"}, schema=SCHEMA)
    assert err.value.field == "payload" and "content" in str(err.value)
    with pytest.raises(InvalidInput) as err:
        pa.stage(session=session, tool="edit", label="W", apply="t.seen",
                 schema={"type": "no-such-type"})
    assert err.value.field == "schema"
    assert pa.pending(session) == []


def test_edit_without_schema_and_with_expect_id(pa: PendingActions, session: str) -> None:
    older = pa.stage(session=session, tool="edit", label="Old", apply="t.seen",
                     payload={"n": 1})
    newer = pa.stage(session=session, tool="edit", label="New", apply="t.seen",
                     payload={"n": 2})
    with pytest.raises(InvalidInput) as err:
        pa.resolve(session=session, action="apply", reason="r", edit={"n": 3}, expect_id=older)
    assert err.value.field == "expect_id"
    res = pa.resolve(session=session, action="apply", reason="r", edit={"n": 3},
                     expect_id=newer)
    assert res.details["sourceResultDetails"]["payload"] == {"n": 3}
    assert [a.id for a in pa.pending(session)] == [older]


def test_expect_id_goes_through_only_for_the_target(pa: PendingActions, rc: redis.Redis,
                                                    session: str) -> None:
    first = pa.stage(session=session, tool="edit", label="First", apply="t.ok")
    second = pa.stage(session=session, tool="edit", label="Second", apply="t.ok")
    before = events(pa, session)
    res = pa.resolve(session=session, action="apply", reason="approve", expect_id=first)
    assert res.is_error and res.text.startswith(f"expect_id: {first} is not the current")
    assert res.details["expect_id"] == first
    assert [a.id for a in pa.pending(session)] == [second, first]
    assert events(pa, session) == before and runs(rc, session) == []
    res = pa.resolve(session=session, action="apply", reason="approve", expect_id=second)
    assert (res.is_error, res.details["label"]) == (False, "Second")
    # a click that arrives late: the id it saw is gone
    late = pa.resolve(session=session, action="apply", reason="approve", expect_id=second)
    assert late.is_error and "expect_id" in late.text
    assert [a.id for a in pa.pending(session)] == [first]


def test_a_returned_error_result_consumes(pa: PendingActions, rc: redis.Redis,
                                          session: str) -> None:
    action_id = pa.stage(session=session, tool="edit", label="Done already",
                         apply="t.error_result")
    res = pa.resolve(session=session, action="apply", reason="r")
    assert (res.is_error, res.text) == (True, "nothing to do: already applied")
    assert pa.pending(session) == [] and pa.next_tool_choice(session) is None
    last = events(pa, session)[-1]
    assert (last["event"], last["id"], last["error"]) == \
        ("applied", action_id, "nothing to do: already applied")
    assert len(runs(rc, session)) == 1


def test_a_raised_error_keeps_the_action(pa: PendingActions, session: str) -> None:
    action_id = pa.stage(session=session, tool="edit", label="L", apply="t.toolerror")
    assert pa.resolve(session=session, action="apply", reason="r").is_error
    assert [(a.id, a.attempts) for a in pa.pending(session)] == [(action_id, 1)]


def test_next_tool_choice_names_only_what_pending_shows(pa: PendingActions, rc: redis.Redis,
                                                        session: str) -> None:
    below = pa.stage(session=session, tool="edit", label="Below", apply="t.ok")
    # a stack entry whose spec is gone (as a crash between two writes by hand could leave)
    stack = Keys().stack(session)
    head: Any = rc.zrange(stack, 0, 0, withscores=True)
    [(_id, score)] = head
    rc.zadd(stack, {"pending-action:edit:0": float(score) - 1})  # the new head
    shown = [a.id for a in pa.pending(session)]
    choice = pa.next_tool_choice(session)
    assert shown == [below] and choice is not None and choice["id"] == below
    assert pa.resolve(session=session, action="apply", reason="r").details["label"] == "Below"
