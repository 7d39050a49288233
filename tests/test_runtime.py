"""CONTRACT section 3 and the directive / standing handler precedence, across real processes."""

from __future__ import annotations

import redis

from pending_actions.broker import REMINDER
from pending_actions.broker.texts import NOTHING_TO_APPLY, NOTHING_TO_DISCARD
from pending_actions.producers import PendingActions, intent, render, tool_definition
from tests.support.runs import runs


def test_reminder_is_exact() -> None:
    assert REMINDER == (
        "<system-reminder>\nThis is a preview. Call the `resolve` tool to apply or discard "
        "these changes.\n</system-reminder>"
    )


def test_soft_requirement_peeks_without_popping(pa: PendingActions, session: str) -> None:
    assert pa.next_tool_choice(session) is None
    first = pa.stage(session=session, tool="edit", label="one", apply="t.ok")
    head = pa.stage(session=session, tool="edit", label="two", apply="t.ok")
    for _ in range(2):
        assert pa.next_tool_choice(session) == {"tool": "resolve", "id": head,
                                                "reminder": REMINDER}
    assert [a.id for a in pa.pending(session)] == [head, first]


def test_directive_takes_precedence_and_is_one_shot(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    staged = pa.stage(session=session, tool="edit", label="staged", apply="t.ok")
    directive = pa.set_directive(session, tool="plan", label="approve plan", apply="t.details")
    choice = pa.next_tool_choice(session)
    assert choice is not None and choice["type"] == "directive"
    assert (choice["id"], choice["label"], choice["tool"]) == (directive, "approve plan", "plan")
    res = pa.resolve(session=session, action="apply", reason="plan ok", extra={"slug": "p"})
    assert (res.text, res.details["label"], res.details["sourceToolName"]) == \
        ("with details", "approve plan", "plan")
    # consumed: the stack is next
    assert pa.next_tool_choice(session) == {"tool": "resolve", "id": staged,
                                            "reminder": REMINDER}
    assert pa.resolve(session=session, action="apply", reason="r").details["label"] == "staged"
    assert [r["id"] for r in runs(rc, session)] == [directive, staged]


def test_failed_directive_is_consumed(pa: PendingActions, rc: redis.Redis,
                                      session: str) -> None:
    """A directive is one shot: the first resolve through it uses it up, whatever its
    outcome; a raising handler included (a stacked action would stay pending)."""
    staged = pa.stage(session=session, tool="edit", label="staged", apply="t.ok")
    directive = pa.set_directive(session, tool="plan", label="p", apply="t.toolerror")
    res = pa.resolve(session=session, action="apply", reason="r")
    assert (res.is_error, res.text, res.details["label"]) == (True, "refused: no reason", "p")
    assert pa.next_tool_choice(session) == {"tool": "resolve", "id": staged,
                                            "reminder": REMINDER}
    assert pa.show(session, directive) is None
    events = [(e["event"], e["id"]) for e in pa.history(session)][-2:]
    assert events == [("taken", directive), ("failed", directive)]


def test_directive_discard_with_reject(pa: PendingActions, session: str) -> None:
    pa.set_directive(session, tool="plan", label="p", apply="t.ok", reject="t.reject_text")
    res = pa.resolve(session=session, action="discard", reason="no")
    assert res.text == "rejected p because no"
    assert pa.next_tool_choice(session) is None


def test_standing_handler_is_the_fallback_and_stays(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    standing = pa.set_standing(session, tool="mode", label="plan mode", apply="t.ok")
    assert pa.next_tool_choice(session) is None  # a standing handler forces nothing
    for _ in range(2):
        res = pa.resolve(session=session, action="apply", reason="r")
        assert (res.is_error, res.details["label"]) == (False, "plan mode")
    staged = pa.stage(session=session, tool="edit", label="staged", apply="t.ok")
    assert pa.resolve(session=session, action="apply", reason="r").details["label"] == "staged"
    assert pa.resolve(session=session, action="apply", reason="r").details["label"] == \
        "plan mode"
    assert pa.clear_standing(session) is True
    assert pa.resolve(session=session, action="apply", reason="r").text == NOTHING_TO_APPLY
    assert pa.resolve(session=session, action="discard", reason="r").text == NOTHING_TO_DISCARD
    ran = runs(rc, session)
    assert [r["id"] for r in ran] == [standing, standing, staged, standing]
    # each resolve through the standing handler is its own unit of work
    keys = [r["key"] for r in ran if r["id"] == standing]
    assert len(set(keys)) == 3


def test_tool_definition() -> None:
    tool = tool_definition()
    assert (tool["name"], tool["label"], tool["hidden"], tool["strict"], tool["approval"]) == \
        ("resolve", "Resolve", True, True, "read")
    params = tool["parameters"]
    assert params["required"] == ["action", "reason"]
    assert params["properties"]["action"]["enum"] == ["apply", "discard"]
    assert params["properties"]["extra"]["type"] == "object"
    assert params["additionalProperties"] is False


def test_intent_lines() -> None:
    assert intent({"action": "apply", "reason": "tests pass"}) == "accepting: tests pass"
    assert intent({"action": "discard", "reason": "wrong"}) == "discarding: wrong"
    assert intent({"action": "apply"}) == "accepting changes"
    assert intent({"action": "discard", "reason": ""}) == "discarding changes"
    # arguments still streaming: action not known yet
    assert intent({}) == "accepting changes"
    assert intent({"reason": "tests pass"}) == "accepting: tests pass"


def test_rendering_of_real_results(pa: PendingActions, session: str) -> None:
    pa.stage(session=session, tool="edit", label="Fix typo", apply="t.ok")
    accepted = render(pa.resolve(session=session, action="apply", reason="good"))
    assert accepted.splitlines()[:2] == ["Accept: Fix typo", "  reason: good"]
    pa.stage(session=session, tool="edit", label="Drop table", apply="t.ok")
    discarded = render(pa.resolve(session=session, action="discard", reason="risky"))
    assert discarded.splitlines()[:2] == ["Discard: Drop table", "  reason: risky"]
    pa.stage(session=session, tool="edit", label="Bad", apply="t.boom")
    failed = render(pa.resolve(session=session, action="apply", reason="try").model_dump())
    assert failed.splitlines() == ["Failed: Bad", "  reason: try", "  Apply failed: kaput"]
    pa.stage(session=session, tool="edit", label="Sticky", apply="t.ok",
             reject="t.reject_raise")
    failed_discard = render(pa.resolve(session=session, action="discard", reason="no"))
    assert failed_discard.splitlines() == ["Discard (error): Sticky", "  reason: no",
                                           "  reject broke"]
