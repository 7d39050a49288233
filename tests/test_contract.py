"""CONTRACT section 2, row by row, across real processes (Redis, resolve worker, dramatiq)."""

from __future__ import annotations

import threading

import pytest
import redis

from pending_actions.broker.errors import InvalidInput, UnknownHandler
from pending_actions.broker.texts import NOTHING_TO_APPLY, NOTHING_TO_DISCARD
from pending_actions.producers import PendingActions
from tests.conftest import Deployment, both
from tests.support.replies import read
from tests.support.runs import runs

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def stage(pa: PendingActions, session: str, label: str = "edit a.py", apply: str = "t.ok",
          reject: str | None = None, **payload: object) -> str:
    return pa.stage(session=session, tool="edit", label=label, apply=apply, reject=reject,
                    payload=dict(payload))


def test_nothing_to_target_apply_is_an_error(pa: PendingActions, session: str) -> None:
    res = pa.resolve(session=session, action="apply", reason="go")
    assert res.is_error
    assert res.text == NOTHING_TO_APPLY
    assert res.details == {"action": "apply", "reason": "go"}


def test_nothing_to_target_discard_succeeds(pa: PendingActions, session: str) -> None:
    res = pa.resolve(session=session, action="discard", reason="no", extra={"k": 1})
    assert not res.is_error
    assert res.text == NOTHING_TO_DISCARD
    assert res.details == {"action": "discard", "reason": "no", "extra": {"k": 1}}


def test_apply_returns_handler_content_and_consumes_once(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    action_id = stage(pa, session)
    assert [a.id for a in pa.pending(session)] == [action_id]
    res = pa.resolve(session=session, action="apply", reason="lgtm")
    assert not res.is_error
    assert res.text == f"applied {action_id}"
    assert res.details == {"action": "apply", "reason": "lgtm", "sourceToolName": "edit",
                           "label": "edit a.py"}
    assert pa.pending(session) == []
    assert [r["id"] for r in runs(rc, session)] == [action_id]
    again = pa.resolve(session=session, action="apply", reason="again")
    assert again.text == NOTHING_TO_APPLY
    assert len(runs(rc, session)) == 1


def test_handler_details_and_extra_pass_through_untouched(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    extra = {"slug": "plan-1", "empty": {}, "list": [], "big": 2**62 + 1, "f": 0.1}
    stage(pa, session, apply="t.details", nested={"x": {}})
    res = pa.resolve(session=session, action="apply", reason="ok", extra=extra)
    assert res.text == "with details"
    assert res.details["extra"] == extra
    assert res.details["sourceResultDetails"] == {"files": ["a.py"], "echo": extra}
    run = runs(rc, session)[0]
    assert run["extra"] == extra
    assert run["payload"] == {"nested": {"x": {}}}


def test_no_source_result_details_when_handler_gives_none(
        pa: PendingActions, session: str) -> None:
    stage(pa, session, label="L")
    res = pa.resolve(session=session, action="apply", reason="r")
    assert "sourceResultDetails" not in res.details
    assert "extra" not in res.details


def test_apply_tool_error_keeps_action_pending_under_same_id(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    below = stage(pa, session, label="below")
    action_id = stage(pa, session, apply="t.toolerror", why="tests are red")
    res = pa.resolve(session=session, action="apply", reason="try")
    assert res.is_error
    assert res.text == "refused: tests are red"
    assert res.details["label"] == "edit a.py"
    head, rest = pa.pending(session)
    assert (head.id, head.attempts, head.last_error) == (action_id, 1, "refused: tests are red")
    assert head.payload == {"why": "tests are red"}
    assert rest.id == below
    res2 = pa.resolve(session=session, action="apply", reason="try again")
    assert res2.text == "refused: tests are red"
    assert pa.pending(session)[0].attempts == 2
    assert [r["attempt"] for r in runs(rc, session)] == [1, 2]
    assert {r["key"] for r in runs(rc, session)} == {action_id}


def test_apply_other_exception_is_wrapped_and_readded(pa: PendingActions, session: str) -> None:
    action_id = stage(pa, session, apply="t.boom")
    res = pa.resolve(session=session, action="apply", reason="go")
    assert res.is_error
    assert res.text == "Apply failed: kaput"
    [head] = pa.pending(session)
    assert (head.id, head.last_error) == (action_id, "Apply failed: kaput")
    # the model can then discard it
    res = pa.resolve(session=session, action="discard", reason="give up")
    assert res.text == "Discarded: edit a.py. Reason: give up"
    assert pa.pending(session) == []


def test_failed_apply_then_retry_succeeds(pa: PendingActions, session: str) -> None:
    stage(pa, session, apply="t.flaky", fail_times=1)
    assert pa.resolve(session=session, action="apply", reason="1").is_error
    res = pa.resolve(session=session, action="apply", reason="2")
    assert (res.is_error, res.text) == (False, "flaky ok on attempt 2")
    assert pa.pending(session) == []


def test_discard_with_reject_result(pa: PendingActions, rc: redis.Redis, session: str) -> None:
    stage(pa, session, label="L", reject="t.reject_text")
    res = pa.resolve(session=session, action="discard", reason="wrong file")
    assert (res.is_error, res.text) == (False, "rejected L because wrong file")
    assert pa.pending(session) == []
    assert [r["handler"] for r in runs(rc, session)] == ["t.reject_text"]


def test_discard_without_reject_uses_default_text(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    stage(pa, session, label="Rename foo")
    res = pa.resolve(session=session, action="discard", reason="not needed")
    assert (res.is_error, res.text) == (False, "Discarded: Rename foo. Reason: not needed")
    assert res.details["label"] == "Rename foo"
    assert pa.pending(session) == []
    assert runs(rc, session) == []  # the apply handler never ran


def test_discard_reject_returning_none_uses_default_text(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    stage(pa, session, label="L", reject="t.none")
    res = pa.resolve(session=session, action="discard", reason="r")
    assert res.text == "Discarded: L. Reason: r"
    assert [r["handler"] for r in runs(rc, session)] == ["t.none"]


def test_discard_reject_raising_keeps_action_and_no_prefix(
        pa: PendingActions, session: str) -> None:
    action_id = stage(pa, session, reject="t.reject_raise")
    res = pa.resolve(session=session, action="discard", reason="r")
    assert (res.is_error, res.text) == (True, "reject broke")
    [head] = pa.pending(session)
    assert head.id == action_id


def test_timeout_reports_error_and_action_still_ends_applied(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    gate_key = f"test:gate:{session}"
    action_id = stage(pa, session, apply="t.gate", gate=gate_key)
    res = pa.resolve(session=session, action="apply", reason="slow", timeout=0.5)
    assert res.is_error
    assert res.text.startswith("Timed out after 0.5s")
    # it is in flight, not lost
    [inflight] = pa.pending(session)
    assert (inflight.id, inflight.state) == (action_id, "in_flight")
    rc.rpush(gate_key, "open")
    # the outcome lands in the history; wait on the stream, not on a clock
    last = b"0-0"
    events: list[str] = []
    while "applied" not in events:
        got = read(rc, pa.ctx.keys.history(session), last, 10_000)
        assert got, "no outcome within 10s"
        for entry_id, fields in got:
            last = entry_id
            events.append(fields[b"event"].decode())
    assert pa.pending(session) == []
    assert [r["handler"] for r in runs(rc, session)] == ["t.gate:start", "t.gate"]


def test_head_first_order(pa: PendingActions, rc: redis.Redis, session: str) -> None:
    a, b, c = (stage(pa, session, label=x) for x in "ABC")
    assert [x.id for x in pa.pending(session)] == [c, b, a]
    labels = [pa.resolve(session=session, action="apply", reason="r").details["label"]
              for _ in range(3)]
    assert labels == ["C", "B", "A"]
    assert [r["id"] for r in runs(rc, session)] == [c, b, a]


def test_ids_are_unique_and_well_formed(pa: PendingActions, session: str) -> None:
    ids = [pa.stage(session=session, tool="ast_edit", label="x", apply="t.ok")
           for _ in range(5)]
    assert len(set(ids)) == 5
    for i in ids:
        prefix, tool, seq = i.split(":")
        assert (prefix, tool) == ("pending-action", "ast_edit") and seq.isdigit()


def test_exactly_once_one_session_eight_threads(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    ids = {stage(pa, session, label=f"a{i}") for i in range(40)}
    results = []
    lock = threading.Lock()

    def resolver() -> None:
        for _ in range(5):
            res = pa.resolve(session=session, action="apply", reason="go")
            with lock:
                results.append(res)

    threads = [threading.Thread(target=resolver) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [r for r in results if r.is_error]
    applied = [r["id"] for r in runs(rc, session)]
    assert sorted(applied) == sorted(ids)  # each exactly once: none twice, none skipped
    assert pa.pending(session) == []


def test_exactly_once_twenty_sessions_at_once(pa: PendingActions, rc: redis.Redis) -> None:
    sessions = [f"multi-{i}-{threading.get_ident()}-{id(rc)}" for i in range(20)]
    staged = {s: {stage(pa, s, label=f"{s}-{i}") for i in range(10)} for s in sessions}
    errors: list[str] = []

    def resolver(s: str) -> None:
        for _ in range(10):
            res = pa.resolve(session=s, action="apply", reason="go")
            if res.is_error:
                errors.append(res.text)

    threads = [threading.Thread(target=resolver, args=(s,)) for s in sessions for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors.count(NOTHING_TO_APPLY) == len(errors)  # 2 threads x 10 for 10 actions
    for s in sessions:
        assert sorted(r["id"] for r in runs(rc, s)) == sorted(staged[s])
        assert pa.pending(s) == []


def test_stage_many_keeps_order_and_checks_everything_first(
        pa: PendingActions, session: str) -> None:
    other = f"{session}-b"
    ids = pa.stage_many([
        {"session": session, "tool": "edit", "label": "A", "apply": "t.ok"},
        {"session": other, "tool": "edit", "label": "X", "apply": "t.ok", "payload": {"k": 1}},
        {"session": session, "tool": "edit", "label": "B", "apply": "t.ok",
         "reject": "t.reject_text"},
    ])
    assert len(set(ids)) == 3
    assert [a.label for a in pa.pending(session)] == ["B", "A"]
    assert [(a.label, a.payload) for a in pa.pending(other)] == [("X", {"k": 1})]
    with pytest.raises(UnknownHandler):
        pa.stage_many([{"session": session, "tool": "edit", "label": "C", "apply": "t.ok"},
                       {"session": session, "tool": "edit", "label": "D", "apply": "nope"}])
    with pytest.raises(InvalidInput) as err:
        pa.stage_many([{"session": session, "tool": "edit", "label": "C", "apply": "t.ok"},
                       {"session": session, "tool": "edit", "label": "", "apply": "t.ok"}])
    assert err.value.field == "label"
    assert [a.label for a in pa.pending(session)] == ["B", "A"]
    assert pa.resolve(session=session, action="apply", reason="r").details["label"] == "B"
