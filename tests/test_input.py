"""Bad input: a clear error naming the field, and nothing staged or taken."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import dramatiq
import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pending_actions.broker.errors import InvalidInput, UnknownHandler
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.routing import read_live
from pending_actions.broker.settings import Settings
from pending_actions.producers import PendingActions
from pending_actions.workers.taskbroker import FIELD as TASK_FIELD
from pending_actions.workers.tasks import ACTOR_NAME, TaskMessage
from tests.support.replies import read, tail_id, xadd

K = Keys()


def snapshot(rc: redis.Redis, session: str) -> tuple[object, ...]:
    return (rc.zrange(K.stack(session), 0, -1), rc.hgetall(K.actions(session)),
            rc.hgetall(K.inflight(session)), rc.get(K.directive(session)))


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "tab\t", "ünï", "a{b}", "a/b", None, 7])
def test_invalid_session_ids(pa: PendingActions, bad: object) -> None:
    with pytest.raises(InvalidInput) as err:
        pa.stage(session=bad, tool="edit", label="x", apply="t.ok")  # type: ignore[arg-type]
    assert err.value.field == "session"
    with pytest.raises(InvalidInput):
        pa.resolve(session=bad, action="apply", reason="r")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        pa.pending(bad)  # type: ignore[arg-type]


def test_longest_valid_session(pa: PendingActions) -> None:
    s = "A-z.0_9:" * 16
    assert len(s) == 128
    pa.stage(session=s, tool="edit", label="x", apply="t.ok")
    assert pa.resolve(session=s, action="apply", reason="r").is_error is False


def test_unknown_handler_refused_at_stage_time(
        pa: PendingActions, rc: redis.Redis, session: str) -> None:
    seq = rc.get(K.seq(K.partition(session)))
    with pytest.raises(UnknownHandler) as err:
        pa.stage(session=session, tool="edit", label="x", apply="nope.missing")
    assert (err.value.field, err.value.name) == ("apply", "nope.missing")
    with pytest.raises(UnknownHandler) as err:
        pa.stage(session=session, tool="edit", label="x", apply="t.ok", reject="nope")
    assert err.value.field == "reject"
    with pytest.raises(UnknownHandler):
        pa.set_directive(session, tool="plan", label="x", apply="nope")
    assert pa.pending(session) == [] and rc.get(K.seq(K.partition(session))) == seq


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, orjson.Fragment(b"{}")])
def test_non_object_payload(pa: PendingActions, session: str, payload: object) -> None:
    with pytest.raises(InvalidInput) as err:
        pa.stage(session=session, tool="edit", label="x", apply="t.ok",
                 payload=payload)  # type: ignore[arg-type]
    assert err.value.field == "payload"
    assert pa.pending(session) == []


def test_oversized_payload(pa: PendingActions, session: str) -> None:
    with pytest.raises(InvalidInput, match="limit") as err:
        pa.stage(session=session, tool="edit", label="x", apply="t.ok",
                 payload={"blob": "x" * (pa.settings.max_payload_bytes + 1)})
    assert err.value.field == "payload"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"action": "apply", "reason": "r", "extra": [1]}, "extra"),
    ({"action": "apply", "reason": "r", "extra": "{}"}, "extra"),
    ({"action": "apply", "reason": None}, "reason"),
    ({"action": "apply", "reason": 5}, "reason"),
    ({"action": "commit", "reason": "r"}, "action"),
    ({"action": "APPLY", "reason": "r"}, "action"),
    ({"action": None, "reason": "r"}, "action"),
])
def test_bad_resolve_input_takes_nothing(pa: PendingActions, rc: redis.Redis, session: str,
                                         kwargs: dict[str, object], field: str) -> None:
    pa.stage(session=session, tool="edit", label="x", apply="t.ok")
    before = snapshot(rc, session)
    with pytest.raises(InvalidInput) as err:
        pa.resolve(session=session, **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
    assert snapshot(rc, session) == before


@pytest.mark.parametrize("timeout", [0, -1, 0.0004, True, "5"])
def test_bad_resolve_timeout_takes_nothing(pa: PendingActions, rc: redis.Redis, session: str,
                                           timeout: object) -> None:
    """A request counts its timeout in whole ms: under 1 ms is refused, not sent."""
    pa.stage(session=session, tool="edit", label="x", apply="t.ok")
    before = snapshot(rc, session)
    with pytest.raises(InvalidInput) as err:
        pa.resolve(session=session, action="apply", reason="r",
                   timeout=timeout)  # type: ignore[arg-type]
    assert err.value.field == "timeout"
    assert snapshot(rc, session) == before


def test_missing_reason_is_a_type_error_in_python(pa: PendingActions, session: str) -> None:
    with pytest.raises(TypeError, match="reason"):
        pa.resolve(session=session, action="apply")  # type: ignore[call-arg]


@pytest.mark.parametrize(("field", "kwargs"), [
    ("tool", {"tool": "bad tool"}), ("tool", {"tool": ""}), ("label", {"label": " "}),
    ("label", {"label": 3}), ("apply", {"apply": "has space"}), ("reject", {"reject": ""}),
])
def test_bad_stage_fields(pa: PendingActions, session: str, field: str,
                          kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"session": session, "tool": "edit", "label": "x", "apply": "t.ok"}
    args.update(kwargs)
    with pytest.raises(InvalidInput) as err:
        pa.stage(**args)  # type: ignore[arg-type]
    assert err.value.field == field
    assert pa.pending(session) == []


raw_fields = st.dictionaries(
    st.sampled_from([ResolveRequest.FIELD, b"x", b"req"]),
    st.one_of(st.binary(max_size=40),
              st.builds(lambda d: orjson.dumps(d), st.dictionaries(
                  st.sampled_from(list(ResolveRequest.model_fields)),
                  st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
                            st.lists(st.booleans(), max_size=2)), max_size=6))),
    min_size=1, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=raw_fields)
def test_malformed_request_entries_are_parked_and_worker_keeps_serving(
        pa: PendingActions, rc: redis.Redis, fields: dict[bytes, bytes]) -> None:
    session = "fuzz-raw"
    pa.stage(session=session, tool="edit", label="keep me", apply="t.ok")
    before = snapshot(rc, session)
    part = K.partition(session)
    last = tail_id(rc, K.requests_dead(part))
    xadd(rc, K.requests(part), fields)
    got = read(rc, K.requests_dead(part), last, 10_000)
    assert got, "malformed entry was not parked"
    reason = got[0][1][b"reason"]
    assert reason
    assert snapshot(rc, session) == before
    # and the worker still serves real requests
    assert pa.resolve(session=session, action="apply", reason="r").is_error is False


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(session=st.text(max_size=140), action=st.one_of(st.text(max_size=10), st.none()),
       reason=st.one_of(st.text(max_size=10), st.integers(), st.none()),
       extra=st.one_of(st.none(), st.integers(), st.text(max_size=5),
                       st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)))
def test_fuzzed_resolve_input(pa: PendingActions, rc: redis.Redis, session: str,
                              action: object, reason: object, extra: object) -> None:
    anchor = "fuzz-anchor"
    if not pa.pending(anchor):
        pa.stage(session=anchor, tool="edit", label="anchor", apply="t.ok")
    before = snapshot(rc, anchor)
    try:
        res = pa.resolve(session=session, action=action, reason=reason,  # type: ignore[arg-type]
                         extra=extra, timeout=10)  # type: ignore[arg-type]
    except InvalidInput as exc:
        assert exc.field in {"session", "action", "reason", "extra"}
    else:
        assert res.details["action"] in ("apply", "discard")
    if session != anchor:
        assert snapshot(rc, anchor) == before


anything = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=12),
                     st.lists(st.integers(), max_size=2),
                     st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
names = st.one_of(st.sampled_from(["t.ok", "t.reject_text", "nope"]), anything)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(session=st.one_of(st.sampled_from(["fz-a", "fz-b"]), anything), tool=anything,
       label=anything, apply=names, reject=st.one_of(st.none(), names),
       payload=st.one_of(st.none(), anything))
def test_fuzzed_stage_and_slots(pa: PendingActions, rc: redis.Redis, session: object,
                                tool: object, label: object, apply: object, reject: object,
                                payload: object) -> None:
    anchor = "fuzz-anchor-2"
    if not pa.pending(anchor):
        pa.stage(session=anchor, tool="edit", label="anchor", apply="t.ok")
    before = snapshot(rc, anchor)
    calls: tuple[Callable[[], object], ...] = (
        lambda: pa.stage(session=session, tool=tool, label=label, apply=apply,  # type: ignore[arg-type]
                         reject=reject, payload=payload),  # type: ignore[arg-type]
        lambda: pa.set_directive(session, tool=tool, label=label, apply=apply,  # type: ignore[arg-type]
                                 reject=reject),  # type: ignore[arg-type]
        lambda: pa.set_standing(session, tool=tool, label=label, apply=apply,  # type: ignore[arg-type]
                                reject=reject),  # type: ignore[arg-type]
    )
    for call in calls:
        try:
            out = call()
        except InvalidInput as exc:
            assert exc.field in {"session", "tool", "label", "apply", "reject", "payload"}
        else:
            assert isinstance(out, str)
    assert snapshot(rc, anchor) == before


def task_entry(kwargs: dict[str, object]) -> bytes:
    """A well-formed dramatiq message for our actor around ``kwargs``."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=Settings().queue, actor_name=ACTOR_NAME, args=(), kwargs=kwargs, options={})
    return orjson.dumps(message.asdict())


task_entries = st.dictionaries(
    st.sampled_from([TASK_FIELD, b"x"]),
    st.one_of(
        st.binary(max_size=30),
        st.builds(task_entry, st.dictionaries(
            st.sampled_from(list(TaskMessage.model_fields)),
            st.one_of(st.text(max_size=6), st.integers(0, 9)), max_size=5)),
        st.builds(lambda d: orjson.dumps(d), st.dictionaries(
            st.text(max_size=6), st.integers(0, 9), max_size=3))),
    min_size=1, max_size=2)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=task_entries)
def test_malformed_task_entries_change_nothing(pa: PendingActions, rc: redis.Redis,
                                               fields: dict[bytes, bytes]) -> None:
    """Raw garbage on the dramatiq task stream: parked or fenced, never run, never fatal."""
    session = f"fuzz-task-{uuid.uuid4().hex[:8]}"
    pa.stage(session=session, tool="edit", label="keep", apply="t.ok")
    before = snapshot(rc, session)
    [pool] = read_live(rc, K).pools
    part = K.partition(session)
    queue, dead = K.task_queue(part, pool), K.task_dead(part, pool)
    last = tail_id(rc, dead)
    entry = xadd(rc, queue, fields)
    deadline = time.monotonic() + 10
    while rc.xrange(queue, entry, entry):  # until the worker has acked or parked it
        assert time.monotonic() < deadline, "garbage task entry never left the queue"
        got = read(rc, dead, last, 200)
        last = got[-1][0] if got else last
    assert snapshot(rc, session) == before
    # and the worker still serves
    assert pa.resolve(session=session, action="apply", reason="r").is_error is False


# what a request can carry: its JSON went through orjson, which has 64-bit integers
INT64 = st.integers(-2**63, 2**63 - 1)


@settings(max_examples=60, deadline=None)
@given(action=st.sampled_from(["apply", "discard"]), reason=st.text(max_size=20),
       extra=st.none() | st.dictionaries(st.text(max_size=5), INT64 | st.text(max_size=5),
                                         max_size=3),
       edit=st.none() | st.dictionaries(st.text(max_size=5), INT64, max_size=2))
def test_the_resolvers_direct_encodings_match_the_models(
        action: str, reason: str, extra: dict[str, Any] | None,
        edit: dict[str, Any] | None) -> None:
    """The resolve worker builds a take's task message and its nothing-to-target reply, and the
    producer its request, without the models; what they build must be what the models would
    have made."""
    from pending_actions.broker.results import nothing_to_target, nothing_to_target_json
    from pending_actions.workers.taskbroker import OrjsonEncoder
    from pending_actions.workers.tasks import encoded_task

    request = ResolveRequest(req=uuid.uuid4().hex, session="s-1", action=action,  # type: ignore[arg-type]
                             reason=reason, extra=extra, edit=edit, timeout_ms=1000,
                             deadline_ms=123, expect_id=None if edit is None else "x:1",
                             by=None if extra is None else "someone")
    # the producer's request, as the resolve worker reads it
    encoded = ResolveRequest.encode(request.req, "s-1", action, reason, extra, 1000, 123,
                                    request.expect_id, request.by, edit)
    assert list(orjson.loads(encoded)) == list(orjson.loads(request.model_dump_json()))
    assert ResolveRequest.from_fields({ResolveRequest.FIELD: encoded}) == request
    assert nothing_to_target_json(action, reason, extra) == \
        nothing_to_target(action, reason, extra).to_json()
    token = uuid.uuid4().hex
    direct = orjson.loads(encoded_task(request, token, "q", "m-1"))
    modelled = OrjsonEncoder().decode(
        TaskMessage.for_lease(request, token).to_message("q").encode())
    assert list(direct) == list(modelled)
    for field in ("message_id", "message_timestamp"):
        direct.pop(field), modelled.pop(field)
    assert direct == modelled
    assert dramatiq.Message.decode(encoded_task(request, token, "q", "m-1")).kwargs == \
        TaskMessage.for_lease(request, token).model_dump()


def test_public_errors_are_importable_from_the_package() -> None:
    """CONTRACT section 8: every public error from ``pending_actions``, each a
    PendingActionsError."""
    import pending_actions

    for name in ("InvalidInput", "RedisUnavailable", "RedisFull", "Forbidden", "Stale",
                 "ToolError"):
        error = getattr(pending_actions, name)
        assert issubclass(error, pending_actions.PendingActionsError), name
        assert name in pending_actions.__all__, name


def nested(levels: int) -> dict[str, Any]:
    """A JSON object ``levels`` deep (``{}`` is one)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def _deep_calls(session: str, field: str, value: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The client method and its arguments that carry ``value`` as ``field``."""
    if field in ("payload", "schema"):
        return "stage", {"session": session, "tool": "edit", "label": "deep",
                         "apply": "t.ok", field: value}
    return "resolve", {"session": session, "action": "apply", "reason": "deep", field: value}


@pytest.mark.parametrize("field", ["payload", "schema", "extra", "edit"])
def test_deep_json_is_refused_naming_the_field(deployment: Any, session: str,
                                               field: str) -> None:
    """600 levels (issue 29, item 13): InvalidInput with ``.field`` from the blocking and the
    asyncio client alike, never orjson's TypeError, and nothing written."""
    import asyncio

    from pending_actions.producers import AsyncPendingActions
    from tests.support.unchanged import redis_unchanged

    pa: PendingActions = deployment.pa
    pa.stage(session=session, tool="edit", label="target of the edit", apply="t.ok")
    method, args = _deep_calls(session, field, nested(600))

    async def from_async() -> None:
        async with AsyncPendingActions.from_url(deployment.url) as apa:
            await getattr(apa, method)(**args)

    with redis_unchanged(deployment.rc):
        with pytest.raises(InvalidInput) as sync:
            getattr(pa, method)(**args)
        with pytest.raises(InvalidInput) as aio:
            asyncio.run(from_async())
    for err in (sync.value, aio.value):
        assert err.field == field and "nested deeper than 64 levels" in str(err)


def test_the_depth_limit_is_exact(pa: PendingActions, session: str) -> None:
    """As deep as ``MAX_DEPTH`` passes, untouched; one more level is refused."""
    from pending_actions.broker.payloads import MAX_DEPTH

    limit = MAX_DEPTH
    pa.stage(session=session, tool="edit", label="deep", apply="t.details",
             payload=nested(limit))
    done = pa.resolve(session=session, action="apply", reason="r", extra=nested(limit))
    assert not done.is_error and done.details["sourceResultDetails"]["echo"] == nested(limit)
    with pytest.raises(InvalidInput) as err:
        pa.stage(session=session, tool="edit", label="deep", apply="t.ok",
                 payload=nested(limit + 1))
    assert err.value.field == "payload"
    with pytest.raises(InvalidInput) as err:
        pa.resolve(session=session, action="apply", reason="r", extra=nested(limit + 1))
    assert err.value.field == "extra"
