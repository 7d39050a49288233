"""CONTRACT section 9, what every adapter shares (pending_actions/adapters/core.py), through a toy
framework (tests/support/adapter_toy.py), a real Redis and a real worker: the run kept in Redis
and claimed by one resume at a time, each call's outcome on resume, and refusals that change
nothing. The frameworks themselves: tests/test_adapter_{openai_agents,pydantic_ai,langgraph}.py."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pending_actions import AsyncPendingActions, Forbidden, InvalidInput, NotPaused
from pending_actions.adapters import core
from pending_actions.adapters.core import label
from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.support import adapter_toy
from tests.support.adapter_toy import Toy
from tests.support.procs import Worker
from tests.support.unchanged import redis_unchanged

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

ASK_ALL = {"default": "ask", "rules": [
    {"name": "no-secrets", "match": {"payload": {"text": "secret*"}}, "decision": "deny",
     "reason": "secrets stay put"},
    {"name": "local", "match": {"payload": {"text": "here*"}}, "decision": "allow"}]}


@pytest.fixture(scope="module")
def effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("toy") / "effects"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, effects: Path,
        ) -> Iterator[str]:
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-toy")).start()
    worker = Worker(server.url, handlers="tests.support.adapter_toy",
                    env={"TOY_EFFECTS": str(effects)}).start()
    pa = PendingActions.from_url(server.url)
    pa.set_policy(ASK_ALL, tenant="acme")
    pa.close()
    with pytest.MonkeyPatch.context() as here:  # the calls allowed run in this process
        here.setenv("TOY_EFFECTS", str(effects))
        yield server.url
    worker.stop()
    server.stop()


@pytest.fixture
def rc(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
def people(url: str) -> Iterator[PendingActions]:
    client = PendingActions.from_url(url, resolve_timeout_s=30)
    yield client
    client.close()


def session() -> str:
    return f"toy-{uuid.uuid4().hex[:8]}"


def go(url: str, agent: list[dict[str, Any]], sid: str, *, resume: bool = False,
       tenant: str = "acme", wait: float = 0, **settings: Any) -> core.AgentRun:
    async def main() -> core.AgentRun:
        async with AsyncPendingActions.from_url(url, **settings) as pa:
            if resume:
                return await core.resume(Toy(), agent, session=sid, tenant=tenant, pa=pa,
                                         wait=wait, options={})
            return await core.run(Toy(), agent, None, session=sid, tenant=tenant, pa=pa,
                                  wait=wait, options={})
    return asyncio.run(main())


def test_ask_pauses_with_the_call_staged_and_its_state_kept(url: str, rc: redis.Redis,
                                                            people: PendingActions) -> None:
    sid = session()
    paused = go(url, [{"text": "hello"}], sid)
    assert paused.status == "paused" and paused.session == sid and len(paused.pending) == 1
    action = people.show(sid, paused.pending[0])
    assert action is not None
    assert (action.tool, action.payload, action.apply) == ("note", {"text": "hello"}, "toy:note")
    assert action.label == 'note(text="hello")' and action.tenant == "acme"
    run = rc.hgetall(Keys().run(sid))
    assert run[b"framework"] == b"toy" and run[b"tenant"] == b"acme" and run[b"lease"] == b""
    assert b'"at":0' in run[b"state"]
    assert 0 < rc.ttl(Keys().run(sid)) <= 7 * 86_400
    # the model's resolve is refused: the policy asks people
    refused = people.resolve(session=sid, action="apply", reason="I think so")
    assert refused.is_error and refused.text.startswith("Needs approval:")


def test_applied_and_discarded_calls_give_the_model_their_outcomes(
        url: str, effects: Path, people: PendingActions) -> None:
    sid = session()
    agent = [{"text": f"one {sid}"}, {"text": f"two {sid}"}]
    first = go(url, agent, sid)
    # still pending: a resume stays paused, and changes nothing but the lease it let go
    assert go(url, agent, sid, resume=True) == first
    applied = people.resolve(session=sid, action="apply", reason="fine", approver="alice")
    assert applied.text == f"noted one {sid}"
    second = go(url, agent, sid, resume=True)
    assert second.status == "paused" and second.pending != first.pending
    people.resolve(session=sid, action="discard", reason="not this one", approver="bob")
    done = go(url, agent, sid, resume=True)
    assert done.status == "done"
    assert done.output == [f"noted one {sid}",
                           f'Discarded: note(text="two {sid}"). Reason: not this one']
    assert [line for line in effects.read_text().splitlines() if sid in line] == [
        f"{first.pending[0]} one {sid}"]
    # the run's record is gone with its end; a second resume finds nothing to continue
    with pytest.raises(NotPaused) as caught:
        go(url, agent, sid, resume=True)
    assert not caught.value.busy


def test_deny_answers_the_model_and_allow_runs_here(url: str, effects: Path,
                                                   people: PendingActions) -> None:
    sid = session()
    done = go(url, [{"text": "secret plans"}, {"text": f"here {sid}"}], sid)
    assert done.status == "done"
    assert done.output[0].startswith("Denied: secrets stay put (policy rule 'no-secrets')")
    assert done.output[1] == f"noted here {sid}"
    assert people.pending(sid) == []
    assert [e["event"] for e in people.history(sid)] == ["denied"]
    assert f"local here {sid}" in effects.read_text().splitlines()


def test_a_failed_apply_keeps_the_run_paused_until_it_is_applied(
        url: str, people: PendingActions) -> None:
    sid = session()
    paused = go(url, [{"text": "fail"}], sid)
    failed = people.resolve(session=sid, action="apply", reason="go", approver="alice")
    assert failed.is_error and failed.text == "Apply failed: asked to fail"
    again = go(url, [{"text": "fail"}], sid, resume=True)
    assert again.status == "paused" and again.pending == paused.pending
    people.resolve(session=sid, action="discard", reason="gave up", approver="alice")
    assert go(url, [{"text": "fail"}], sid, resume=True).output == [
        'Discarded: note(text="fail"). Reason: gave up']


def test_a_resume_while_another_continues_the_run_is_refused(
        url: str, people: PendingActions, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first resume holds the run while its allowed second call runs here (held on an
    event); a second resume meanwhile raises NotPaused(busy), and the run went on once."""
    sid = session()
    agent = [{"text": "first"}, {"text": f"here {sid}"}]
    go(url, agent, sid)
    people.resolve(session=sid, action="apply", reason="ok", approver="alice")
    inside, release = threading.Event(), threading.Event()
    calls: list[str] = []
    body = adapter_toy.NOTE.fn

    def held(text: str) -> str:
        calls.append(text)
        inside.set()
        assert release.wait(30)
        return str(body(text))

    monkeypatch.setattr(adapter_toy.NOTE, "fn", held)

    async def both() -> tuple[core.AgentRun, BaseException | None]:
        async with AsyncPendingActions.from_url(url) as pa:
            first = asyncio.create_task(core.resume(Toy(), agent, session=sid, tenant="acme",
                                                    pa=pa, wait=0, options={}))
            await asyncio.to_thread(inside.wait, 30)
            try:
                await core.resume(Toy(), agent, session=sid, tenant="acme", pa=pa, wait=0,
                                  options={})
                second: BaseException | None = None
            except NotPaused as exc:
                second = exc
            release.set()
            return await first, second

    done, refused = asyncio.run(both())
    assert done.status == "done" and calls == [f"here {sid}"]
    assert isinstance(refused, NotPaused) and refused.busy


def test_refusals_change_nothing(url: str, rc: redis.Redis) -> None:
    sid = session()
    go(url, [{"text": "x"}], sid)
    # another tenant's session: as a missing one
    with redis_unchanged(rc), pytest.raises(NotPaused) as foreign:
        go(url, [], sid, resume=True, tenant="beta")
    other = session()
    with redis_unchanged(rc), pytest.raises(NotPaused) as missing:
        go(url, [], other, resume=True, tenant="acme")
    assert str(foreign.value).replace(sid, "S") == str(missing.value).replace(other, "S")
    assert not foreign.value.busy and not missing.value.busy
    # a second run while one is paused; a run in another tenant's session
    with redis_unchanged(rc), pytest.raises(InvalidInput, match="has a paused run"):
        go(url, [{"text": "y"}], sid)
    with redis_unchanged(rc), pytest.raises(Forbidden):
        go(url, [{"text": "y"}], sid, tenant="beta")


def test_a_save_by_a_lease_taken_over_writes_nothing(url: str, rc: redis.Redis) -> None:
    sid = session()
    go(url, [{"text": "x"}], sid)

    async def main() -> None:
        async with AsyncPendingActions.from_url(url) as pa:
            mine = await pa.claim_run(sid, "acme", "token-a", fresh=False)
            assert mine.status.name == "CLAIMED"
            # the lease runs out (as when its process died) and another takes the run
            rc.hset(Keys().run(sid), "until", 0)
            theirs = await pa.claim_run(sid, "acme", "token-b", fresh=False)
            assert theirs.status.name == "CLAIMED"
            with redis_unchanged(rc):
                assert not await pa.save_run(sid, "token-a", done=True)
            assert await pa.save_run(sid, "token-b", done=False, framework=mine.framework,
                                     state=mine.state, calls=mine.calls.encode())
    asyncio.run(main())


def test_the_frameworks_own_approval_flag_asks_people_whatever_is_allowed(
        url: str, people: PendingActions) -> None:
    """The policy allows "here..." (it would run at once); the tool's approval flag stages it
    as an ask of one person, which the model's resolve cannot apply."""
    sid = session()
    paused = go(url, [{"text": f"here {sid}", "careful": True}], sid)
    assert paused.status == "paused"
    action = people.show(sid, paused.pending[0])
    assert action is not None and action.apply == "toy:careful"
    assert action.policy == {"rule": "toy:approval", "decision": "ask", "approvals": 1,
                             "version": 1}
    refused = people.resolve(session=sid, action="apply", reason="mine")
    assert refused.is_error and refused.text.startswith("Needs approval:")
    assert people.resolve(session=sid, action="apply", reason="ok",
                          approver="carol").text == f"noted here {sid}"
    assert go(url, [{"text": f"here {sid}", "careful": True}], sid,
              resume=True).output == [f"noted here {sid}"]


def test_with_no_policy_a_call_is_asked_of_people(url: str, people: PendingActions) -> None:
    sid = session()
    paused = go(url, [{"text": "unruled"}], sid, tenant="nopolicy")
    action = people.show(sid, paused.pending[0])
    assert action is not None and action.policy is not None
    assert (action.policy["rule"], action.policy["decision"]) == ("toy:no-policy", "ask")
    refused = people.resolve(session=sid, action="apply", reason="mine", tenant="nopolicy")
    assert refused.is_error and refused.text.startswith("Needs approval:")


def test_a_framework_that_fails_leaves_the_run_as_it_was(url: str,
                                                         people: PendingActions) -> None:
    """A failure inside run() frees the session at once; inside resume(), the run stays
    paused as it was, for a later resume (neither waits for RUN_LEASE_S)."""
    sid = session()
    with pytest.raises(RuntimeError, match="toy framework failed"):
        go(url, [{"crash": True}], sid)
    paused = go(url, [{"text": "a"}, {"crash": True}], sid)
    people.resolve(session=sid, action="apply", reason="ok", approver="alice")
    with pytest.raises(RuntimeError, match="toy framework failed"):
        go(url, [{"text": "a"}, {"crash": True}], sid, resume=True)
    done = go(url, [{"text": "a"}], sid, resume=True)
    assert paused.status == "paused" and done.output == ["noted a"]


def test_a_call_that_reuses_an_id_never_runs_on_an_earlier_answer(
        url: str, effects: Path, people: PendingActions) -> None:
    """A call id given before answers a later call of the same id, which never runs on it: a
    verdict holds only for the same tool and arguments (another call is refused), and what
    people decided for a paused call is that call's answer, whatever reuses its id."""
    sid = session()
    done = go(url, [{"id": "x", "text": f"here {sid}"}, {"id": "x", "text": f"here two {sid}"}],
              sid)
    assert done.output[0] == f"noted here {sid}"
    assert done.output[1].startswith("Refused: the call id 'x' was already used")
    assert f"local here two {sid}" not in effects.read_text().splitlines()
    other = session()
    agent = [{"id": "y", "text": f"asked {other}"}, {"id": "y", "text": f"here {other}"}]
    go(url, agent, other)
    people.resolve(session=other, action="apply", reason="ok", approver="alice")
    resumed = go(url, agent, other, resume=True)
    assert resumed.output == [f"noted asked {other}", f"noted asked {other}"]
    assert f"local here {other}" not in effects.read_text().splitlines()


def test_calls_staged_by_a_run_that_fails_before_it_pauses_are_discarded(
        url: str, people: PendingActions) -> None:
    """A pause of two calls whose second stage is refused (the session's pending cap): the run
    raises, and the first call, staged already, is discarded again: no run would come back for
    it, so no person is left to approve it."""
    sid = session()
    with pytest.raises(InvalidInput, match="MAX_PENDING_PER_SESSION"):
        go(url, [{"turn": [{"text": "one"}, {"text": "two"}]}], sid,
           max_pending_per_session=1)
    assert people.pending(sid) == []
    ended = [e for e in people.history(sid) if e["event"] == "discarded"]
    assert len(ended) == 1 and ended[0]["reason"] == "its agent run failed before it paused"
    # and the session is free for a run again
    assert go(url, [{"text": "again"}], sid).status == "paused"


def held_here(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event,
                                                       list[str]]:
    """``note`` run here (an allowed call) held until the test releases it."""
    inside, release = threading.Event(), threading.Event()
    calls: list[str] = []
    body = adapter_toy.NOTE.fn

    def held(text: str) -> str:
        calls.append(text)
        inside.set()
        assert release.wait(30)
        return str(body(text))

    monkeypatch.setattr(adapter_toy.NOTE, "fn", held)
    return inside, release, calls


def test_a_continuation_longer_than_its_lease_is_still_the_only_one(
        url: str, people: PendingActions, monkeypatch: pytest.MonkeyPatch) -> None:
    """RUN_LEASE_S 1 s; the resumed run's allowed call takes longer than that: its lease is
    renewed, so a resume after the first lease would have run out is refused (busy), and the
    allowed call ran once."""
    sid = session()
    agent = [{"text": "first"}, {"text": f"here {sid}"}]
    go(url, agent, sid)
    people.resolve(session=sid, action="apply", reason="ok", approver="alice")
    inside, release, calls = held_here(monkeypatch)

    async def both() -> tuple[core.AgentRun, BaseException | None]:
        async with AsyncPendingActions.from_url(url, run_lease_s=1.0) as pa:
            first = asyncio.create_task(core.resume(Toy(), agent, session=sid, tenant="acme",
                                                    pa=pa, wait=0, options={}))
            await asyncio.to_thread(inside.wait, 30)
            await asyncio.sleep(1.5)  # the fault: past the lease the first claim took
            second: BaseException | None = None
            try:
                await core.resume(Toy(), agent, session=sid, tenant="acme", pa=pa, wait=0,
                                  options={})
            except NotPaused as exc:
                second = exc
            release.set()
            return await first, second

    done, refused = asyncio.run(both())
    assert done.status == "done" and calls == [f"here {sid}"]
    assert isinstance(refused, NotPaused) and refused.busy


def test_a_run_whose_lease_was_taken_over_stops_and_keeps_nothing(
        url: str, rc: redis.Redis, people: PendingActions,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease taken by another process while the run works (this one stalled past it): the
    renewal finds it gone, the work here stops with NotPaused (busy), and what it would have
    staged next is not staged."""
    sid = session()
    agent = [{"text": "first"}, {"text": f"here {sid}"}, {"text": "third"}]
    paused = go(url, agent, sid)
    people.resolve(session=sid, action="apply", reason="ok", approver="alice")
    inside, release, _calls = held_here(monkeypatch)

    async def main() -> BaseException | None:
        async with AsyncPendingActions.from_url(url, run_lease_s=0.6) as pa:
            first = asyncio.create_task(core.resume(Toy(), agent, session=sid, tenant="acme",
                                                    pa=pa, wait=0, options={}))
            await asyncio.to_thread(inside.wait, 30)
            rc.hset(Keys().run(sid), "lease", "another-process")
            try:
                await first
            except NotPaused as exc:
                return exc
            finally:
                release.set()
            return None

    lost = asyncio.run(main())
    assert isinstance(lost, NotPaused) and lost.busy
    assert [a.id for a in people.pending(sid)] == []
    assert rc.hget(Keys().run(sid), "lease") == b"another-process"
    assert paused.pending[0] not in [a.id for a in people.pending(sid)]


def test_arguments_that_cannot_be_kept_are_refused_and_the_run_goes_on(url: str) -> None:
    done = go(url, [{"text": "\ud800"}, {"text": "here fine"}], session())
    assert done.output[0].startswith("Refused: the arguments of note cannot be kept as JSON")
    assert done.output[1] == "noted here fine"


def test_a_label_shows_what_the_model_wrote_and_hides_nothing() -> None:
    shown = label("note", {"text": "a\u2028b\u202ec\x85d", "path": "A" * 80 + "/etc/passwd"})
    assert "\u2028" not in shown and "\u202e" not in shown and "\x85" not in shown
    assert len(shown.splitlines()) == 1
    assert "\\u2028" in shown and "\\u202e" in shown and "\\u0085" in shown
    assert shown.endswith('/etc/passwd")') and "…" in shown
