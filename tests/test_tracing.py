"""CONTRACT section 8, Tracing (issue 33): one trace from the agent's decision to the handler.

Real parts: an OTLP/HTTP receiver in this process (tests/support/otlp.py, decoding what the
SDK's own exporter sends), agents in processes of their own (tests/support/agent.py), workers
started through the CLI exporting to the receiver from the standard OTEL_* variables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

from pending_actions.broker import tracing
from pending_actions.broker.keys import Keys
from pending_actions.broker.policy.rules import Verdict
from pending_actions.broker.routing import heartbeat
from pending_actions.procs import ROOT, child_env
from tests.support.faults import FAST, cluster, started_pid
from tests.support.otlp import Receiver, Span, receiver
from tests.support.procs import Worker
from tests.support.runs import runs

K = Keys()
pool = ThreadPoolExecutor(max_workers=2)
STAGE, RESOLVE, TAKE, APPLY = "pending_actions.stage", "pending_actions.resolve", \
    "pending_actions.take", "pending_actions.apply"


def agent(url: str, mode: str, op: str, otlp: Receiver | None = None,
          **kwargs: Any) -> dict[str, Any]:
    """One turn of an agent in its own process (``tests/support/agent.py``)."""
    env = child_env(otlp.env("agent") if otlp is not None else {})
    done = subprocess.run([sys.executable, "-m", "tests.support.agent", url, mode, op,
                           orjson.dumps(kwargs).decode()], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got: dict[str, Any] = orjson.loads(done.stdout)
    return got


def traced_worker(url: str, otlp: Receiver, log: Path, **overrides: str) -> Worker:
    return Worker(url, overrides={**FAST, **overrides}, env=otlp.env("workers"),
                  log_path=log).start()


def child_of(span: Span, parent: Span) -> bool:
    return span.trace_id == parent.trace_id and span.parent_id == parent.span_id


def test_the_handler_span_is_in_the_resolves_trace_linked_to_the_stage(tmp_path: Path) -> None:
    """Issue 33's done-when: the stage span in the agent's first trace, the worker's
    pending_actions.apply span in the trace of the resolve, linked to the stage, with
    pending_actions.outcome = applied; the take and the queue wait between them."""
    with receiver() as otlp, cluster(tmp_path, workers=0) as (server, workers, _pa):
        workers.append(traced_worker(server.url, otlp, tmp_path / "worker.log"))
        first = agent(server.url, "traced", "stage", otlp, session="s", tool="edit",
                      label="L", apply="t.ok")
        action_id = first["value"]
        second = agent(server.url, "traced", "resolve", otlp, session="s", action="apply",
                       reason="r")
        assert not second["value"]["is_error"], second
        assert first["trace_id"] != second["trace_id"]  # two turns, two traces

        stage = otlp.one(STAGE, action_id=action_id)
        assert (stage.service, stage.trace_id, stage.parent_id) == \
            ("agent", first["trace_id"], first["span_id"])
        assert stage.attributes["pending_actions.session"] == "s"
        assert stage.attributes["pending_actions.tool"] == "edit"
        resolve = otlp.one(RESOLVE, session="s")
        assert (resolve.trace_id, resolve.parent_id) == (second["trace_id"],
                                                        second["span_id"])
        take = otlp.one(TAKE, action_id=action_id)
        assert take.service == "workers" and child_of(take, resolve)
        apply = otlp.one(APPLY, action_id=action_id)
        assert apply.service == "workers" and child_of(apply, take)
        assert apply.trace_id == second["trace_id"]
        assert apply.links == [(stage.trace_id, stage.span_id)]
        assert apply.attributes["pending_actions.outcome"] == "applied"
        assert apply.attributes["pending_actions.session"] == "s"
        assert apply.attributes["pending_actions.tool"] == "edit"
        [(_name, fields)] = [e for e in apply.events if e[0] == "pending_actions.dequeued"]
        assert fields["pending_actions.queued_ms"] >= 0
        # (the span ends once the outcome and its reply are written: after the caller has it)
        assert resolve.start_ns <= take.start_ns <= apply.start_ns <= apply.end_ns


def test_a_failed_apply_and_its_retry(tmp_path: Path) -> None:
    """A failed apply's span records the exception and the re-add; the retry, decided by a
    second resolve, is in that resolve's trace; both link to the same stage (the spec keeps
    its context across the re-add). The worker's log line of the failure carries the span's
    trace and span ids."""
    log = tmp_path / "worker.log"
    with receiver() as otlp, cluster(tmp_path, workers=0) as (server, workers, _pa):
        workers.append(traced_worker(server.url, otlp, log))
        action_id = agent(server.url, "traced", "stage", otlp, session="s", tool="edit",
                          label="L", apply="t.flaky",
                          payload={"fail_times": 1, "crash": True})["value"]
        failed = agent(server.url, "traced", "resolve", otlp, session="s", action="apply",
                       reason="one")
        assert failed["value"]["is_error"]
        done = agent(server.url, "traced", "resolve", otlp, session="s", action="apply",
                     reason="two")
        assert not done["value"]["is_error"], done
        stage = otlp.one(STAGE, action_id=action_id)
        one = otlp.one(APPLY, action_id=action_id, attempt=1)
        two = otlp.one(APPLY, action_id=action_id, attempt=2)
        assert (one.trace_id, two.trace_id) == (failed["trace_id"], done["trace_id"])
        assert one.links == two.links == [(stage.trace_id, stage.span_id)]
        assert one.attributes["pending_actions.outcome"] == "failed" and one.status == 2
        names = [name for name, _f in one.events]
        assert "exception" in names and "pending_actions.readd" in names
        assert two.attributes["pending_actions.outcome"] == "applied" and two.status != 2
        assert "pending_actions.readd" not in [name for name, _f in two.events]
        line = next(x for x in log.read_text().splitlines()
                    if f"handler t.flaky for {action_id} failed" in x)
        assert line.endswith(f"trace_id={one.trace_id} span_id={one.span_id}")
        untraced = [x for x in log.read_text().splitlines() if "trace_id=" not in x]
        assert untraced  # the lines made outside a span are as they were


def test_a_policys_decisions_on_the_stage_span_and_auto_in_the_stages_trace(
        tmp_path: Path) -> None:
    """A tenant's policy: a denied stage's span says deny, its rule and outcome denied; an
    asked one says ask. An auto-applied action is decided by its stage, so its take and its
    handler's span are in the stage's trace, children of the stage span (and linked to it)."""
    policy = {"rules": [
        {"name": "no-rm", "match": {"tool": "rm"}, "decision": "deny", "reason": "no"},
        {"name": "people", "match": {"tool": "deploy"}, "decision": "ask"},
        {"name": "reads", "match": {"tool": "read"}, "decision": "allow", "auto": True}]}
    with receiver() as otlp, cluster(tmp_path, workers=0) as (server, workers, pa):
        workers.append(traced_worker(server.url, otlp, tmp_path / "worker.log"))
        pa.set_policy(policy, tenant="acme")
        base = {"session": "p", "label": "L", "apply": "t.ok", "tenant": "acme"}
        denied = agent(server.url, "traced", "stage", otlp, tool="rm", **base)
        assert "Denied: no" in denied["value"]["error"]
        asked = agent(server.url, "traced", "stage", otlp, tool="deploy", **base)["value"]
        auto = agent(server.url, "traced", "stage", otlp, tool="read", **base)
        spans = {s.trace_id: s for s in otlp.wait(lambda s: s.name == STAGE, count=3)}
        attributes = spans[denied["trace_id"]].attributes
        assert (attributes["pending_actions.policy.decision"],
                attributes["pending_actions.policy.rule"],
                attributes["pending_actions.outcome"]) == ("deny", "no-rm", "denied")
        assert spans[denied["trace_id"]].status == 2  # the stage raised Denied
        ask = otlp.one(STAGE, action_id=asked)
        assert (ask.attributes["pending_actions.policy.decision"],
                ask.attributes["pending_actions.policy.rule"]) == ("ask", "people")
        assert "pending_actions.outcome" not in ask.attributes
        stage = otlp.one(STAGE, action_id=auto["value"])
        assert stage.attributes["pending_actions.policy.decision"] == "auto"
        apply = otlp.one(APPLY, action_id=auto["value"])
        take = otlp.one(TAKE, action_id=auto["value"])
        # both children of the stage: the lease stage.lua wrote carries the stage's context
        assert child_of(take, stage) and child_of(apply, stage)
        assert apply.trace_id == auto["trace_id"]
        assert apply.links == [(stage.trace_id, stage.span_id)]
        assert apply.attributes["pending_actions.outcome"] == "applied"


def test_the_other_outcomes_discarded_stale_expired(tmp_path: Path) -> None:
    """A discard runs the reject handler under ``pending_actions.reject`` (outcome discarded);
    a handler raising Stale ends its apply span as stale; an action whose ttl passes ends in a
    ``pending_actions.expire`` span of recovery's, linked to its stage."""
    with receiver() as otlp, cluster(tmp_path, workers=0) as (server, workers, _pa):
        workers.append(traced_worker(server.url, otlp, tmp_path / "worker.log"))
        rejected = agent(server.url, "traced", "stage", otlp, session="o", tool="mail",
                         label="L", apply="t.ok", reject="t.reject_text")["value"]
        assert not agent(server.url, "traced", "resolve", otlp, session="o", action="discard",
                         reason="no")["value"]["is_error"]
        reject = otlp.one("pending_actions.reject", action_id=rejected)
        assert reject.attributes["pending_actions.outcome"] == "discarded"
        stale = agent(server.url, "traced", "stage", otlp, session="o", tool="edit", label="L",
                      apply="t.stale", fingerprint="v1", payload={"current": "v2"})["value"]
        said = agent(server.url, "traced", "resolve", otlp, session="o", action="apply",
                     reason="go")["value"]
        assert said["is_error"] and said["text"].startswith("Stale:"), said
        assert otlp.one(APPLY, action_id=stale).attributes["pending_actions.outcome"] == "stale"
        staged = agent(server.url, "traced", "stage", otlp, session="x", tool="edit", label="L",
                       apply="t.ok", ttl=0.2)
        expiry = otlp.one("pending_actions.expire", action_id=staged["value"])
        stage = otlp.one(STAGE, action_id=staged["value"])
        assert expiry.attributes["pending_actions.outcome"] == "expired"
        assert expiry.service == "workers" and expiry.trace_id != stage.trace_id
        assert expiry.links == [(stage.trace_id, stage.span_id)]


def test_a_worker_killed_mid_handler(tmp_path: Path) -> None:
    """The dramatiq process is SIGKILLed inside the handler: recovery's span is in the trace
    of the resolve that took the action (the lease carries its context), and the retried
    attempt's span is in the trace of the resolve that decided it, linked to the stage."""
    with receiver() as otlp, cluster(tmp_path, workers=0) as (server, workers, _pa):
        workers.append(traced_worker(server.url, otlp, tmp_path / "worker.log"))
        rc = redis.Redis.from_url(server.url)
        action_id = agent(server.url, "traced", "stage", otlp, session="s", tool="edit",
                          label="L", apply="t.gate", payload={"gate": "gate:s"})["value"]
        waiting = pool.submit(agent, server.url, "traced", "resolve", otlp, session="s",
                              action="apply", reason="one")
        os.kill(started_pid(rc, "s"), signal.SIGKILL)
        lost = waiting.result(timeout=60)
        assert lost["value"]["is_error"] and "interrupted" in lost["value"]["text"]
        rc.rpush("gate:s", "open")
        done = agent(server.url, "traced", "resolve", otlp, session="s", action="apply",
                     reason="two")
        assert not done["value"]["is_error"], done
        assert [r["attempt"] for r in runs(rc, "s") if r["handler"] == "t.gate"] == [2]
        take = otlp.one(TAKE, action_id=action_id, attempt=1)
        recover = otlp.one("pending_actions.recover", action_id=action_id)
        assert take.trace_id == lost["trace_id"] and child_of(recover, take)
        assert recover.attributes["pending_actions.outcome"] == "recovered"
        assert recover.attributes["pending_actions.started"] is True
        stage = otlp.one(STAGE, action_id=action_id)
        retried = otlp.one(APPLY, action_id=action_id, attempt=2)
        assert retried.trace_id == done["trace_id"]
        assert retried.links == [(stage.trace_id, stage.span_id)]
        assert retried.attributes["pending_actions.outcome"] == "applied"
        # the killed attempt exported nothing; its process was gone before its span ended
        assert [s for s in otlp.spans if s.name == APPLY and
                s.attributes["pending_actions.attempt"] == 1] == []


def _request_fields(rc: redis.Redis, session: str) -> dict[str, Any]:
    entries: Any = rc.xrange(K.requests(K.partition(session)))
    [(_id, fields)] = entries
    request: dict[str, Any] = orjson.loads(fields[b"r"])
    return request


@pytest.mark.parametrize("mode", ["untraced", "absent"])
def test_nothing_is_written_without_a_context(tmp_path: Path, mode: str) -> None:
    """With OpenTelemetry installed but no provider and no span, and without it at all, the
    spec and the request have no trace field: not a byte more."""
    with cluster(tmp_path, workers=0) as (server, _workers, _pa):
        rc = redis.Redis.from_url(server.url)
        heartbeat(rc, K, "p", ["t.ok"], "by-hand", 60_000)  # live, with no worker to take
        got = agent(server.url, mode, "stage", session="s", tool="edit", label="L",
                    apply="t.ok")
        assert got["available"] is (mode == "untraced")
        spec = orjson.loads(rc.hget(K.actions("s"), got["value"]) or b"")
        assert "trace" not in spec and spec["label"] == "L"
        agent(server.url, mode, "resolve", session="s", action="apply", reason="r",
              timeout=0.2)
        request = _request_fields(rc, "s")
        assert "trace" not in request and request["reason"] == "r"


def test_the_callers_context_is_carried_when_it_has_no_provider(tmp_path: Path) -> None:
    """An agent whose provider is its own (not the global one) still has a current span: the
    client's spans do not record, and the spec and the request carry the caller's context."""
    from pending_actions.producers import PendingActions

    tracer = TracerProvider().get_tracer("agent")
    with cluster(tmp_path, workers=0) as (server, _workers, _pa):
        rc = redis.Redis.from_url(server.url)
        heartbeat(rc, K, "p", ["t.ok"], "by-hand", 60_000)
        pa = PendingActions.from_url(server.url)
        try:
            with tracer.start_as_current_span("turn") as turn:
                action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
                pa.resolve(session="s", action="apply", reason="r", timeout=0.2)
        finally:
            pa.close()
        context = turn.get_span_context()
        want = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        assert orjson.loads(rc.hget(K.actions("s"), action_id) or b"")["trace"] == want
        assert _request_fields(rc, "s")["trace"] == want


def test_a_carried_context_round_trips_with_its_tracestate() -> None:
    tracer = TracerProvider().get_tracer("t")
    parent = tracing.context_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 "
                                "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    with tracer.start_as_current_span("x", context=parent) as span:
        text = tracing.carried()
    assert text is not None
    context = span.get_span_context()
    assert text == (f"00-0af7651916cd43dd8448eb211c80319c-{context.span_id:016x}-"
                    f"{context.trace_flags:02x} congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert tracing.carried() is None  # no span current now
    assert tracing.context_of(None) is None and tracing.context_of("") is None


def test_a_carried_context_reads_as_the_standard_propagator_reads_it() -> None:
    """context_of reads a plain version-00 traceparent itself: what it finds is what the SDK's
    propagator finds, for that form and for every other (each then read by the propagator)."""
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ids = "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"
    for text in [f"00-{ids}-01", f"00-{ids}-00", f"00-{ids}-03", f"00-{ids}-01 k=v",
                 f"00-{'0' * 32}-b7ad6b7169203331-01", f"00-{ids[:33]}{'0' * 16}-01",
                 f"00-{ids.upper()}-01", f"ff-{ids}-01", f"01-{ids}-01-later", f"00-{ids}-1",
                 f"00-{ids}-01-x", "garbage"]:
        parent, _, state = text.partition(" ")
        want = get_current_span(TraceContextTextMapPropagator().extract(
            {"traceparent": parent, **({"tracestate": state} if state else {})})
        ).get_span_context()
        got = get_current_span(tracing.context_of(text)).get_span_context()
        assert (got.is_valid, got.trace_id, got.span_id, got.trace_flags, got.is_remote,
                got.trace_state) == (want.is_valid, want.trace_id, want.span_id,
                                     want.trace_flags, want.is_remote, want.trace_state), text


def test_which_exporters_the_standard_variables_ask_for() -> None:
    names = tracing.exporter_names
    assert names({}) == []
    assert names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == ["otlp_proto_http"]
    assert names({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces",
                  "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ["otlp_proto_grpc"]
    assert names({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ["console", "otlp_proto_http"]
    assert names({"OTEL_TRACES_EXPORTER": "none",
                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == []
    assert names({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}) == []


def test_log_lines_carry_the_ids_only_inside_a_span(tmp_path: Path) -> None:
    import logging

    handler = logging.FileHandler(tmp_path / "log")
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    ours, theirs = logging.getLogger("pending_actions.x"), logging.getLogger("other")
    for logger in (ours, theirs):
        logger.setLevel(logging.INFO)
    try:
        tracing.log_ids()
        tracing.log_ids()  # once is enough: no second suffix
        ours.info("before %s", uuid.UUID(int=1))
        with TracerProvider().get_tracer("t").start_as_current_span("x") as span:
            ours.info("inside %d", 2)
            theirs.info("theirs")
    finally:
        root.removeHandler(handler)
        handler.close()
    c = span.get_span_context()
    assert (tmp_path / "log").read_text().splitlines() == [
        "INFO pending_actions.x: before 00000000-0000-0000-0000-000000000001",
        f"INFO pending_actions.x: inside 2 trace_id={c.trace_id:032x} span_id={c.span_id:016x}",
        "INFO other: theirs"]


def test_the_producers_request_with_a_trace_is_what_the_model_makes() -> None:
    """The request's direct encoding (tests/test_input.py compares it without a trace) with one:
    the same fields in the same order, read back as the model."""
    from pending_actions.broker.models import ResolveRequest

    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 congo=t61rcWkgMzE"
    request = ResolveRequest(req=uuid.uuid4().hex, session="s", action="apply", reason="r",
                             timeout_ms=1000, deadline_ms=123, trace=trace)
    encoded = ResolveRequest.encode(request.req, "s", "apply", "r", None, 1000, 123, None,
                                    None, None, trace)
    assert list(orjson.loads(encoded)) == list(orjson.loads(request.model_dump_json()))
    assert ResolveRequest.from_fields({ResolveRequest.FIELD: encoded}) == request
    assert "trace" not in orjson.loads(request.model_copy(update={"trace": None})
                                       .model_dump_json())


def test_the_policy_hook_puts_the_decision_on_the_current_span() -> None:
    """The hook the policies code calls where a stage's decision is known (while the stage
    span is current): its decision and rule become the span's attributes, a deny its
    outcome."""
    tracer = TracerProvider().get_tracer("t")

    def attributes(*verdicts: Verdict | None) -> dict[str, Any]:
        with tracer.start_as_current_span("stage") as span:
            tracing.policy_decided(verdicts)
        return dict(cast(ReadableSpan, span).attributes or {})

    assert attributes(Verdict("deny", "no-deploys-on-friday")) == {
        "pending_actions.policy.decision": "deny",
        "pending_actions.policy.rule": "no-deploys-on-friday",
        "pending_actions.outcome": "denied"}
    assert attributes(Verdict("ask", None, approvals=2)) == {
        "pending_actions.policy.decision": "ask"}
    assert attributes(Verdict("allow", "reads", auto=True)) == {
        "pending_actions.policy.decision": "auto", "pending_actions.policy.rule": "reads"}
    # a batch decided two ways: no one decision, but a denied action is the stage's outcome
    assert attributes(Verdict("allow", "a"), Verdict("deny", "b")) == {
        "pending_actions.outcome": "denied"}
    assert attributes(None) == {}  # no policy: nothing said


def test_a_worker_that_keeps_no_spans_passes_the_context_on(tmp_path: Path) -> None:
    """A worker without OTEL_* variables records nothing, but its take writes the request's
    context into the lease as it came (kept by begin.lua's rewrite of the lease), for the
    handler to run under."""
    from pending_actions.producers import PendingActions

    tracer = TracerProvider().get_tracer("agent")
    with cluster(tmp_path) as (server, _workers, _pa):
        rc = redis.Redis.from_url(server.url)
        pa = PendingActions.from_url(server.url)
        pa.stage(session="s", tool="edit", label="L", apply="t.gate",
                 payload={"gate": "gate:s"})

        def resolve() -> tuple[Any, str]:
            with tracer.start_as_current_span("turn") as turn:
                result = pa.resolve(session="s", action="apply", reason="r")
            c = turn.get_span_context()
            return result, f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"

        try:
            waiting = pool.submit(resolve)
            started_pid(rc, "s")
            leases: Any = rc.hvals(K.inflight("s"))
            [lease] = [orjson.loads(raw) for raw in leases]
            rc.rpush("gate:s", "open")
            result, want = waiting.result(timeout=30)
        finally:
            pa.close()
        assert not result.is_error, result.text
        assert (lease["state"], lease["trace"]) == ("running", want)


@pytest.mark.parametrize("sampler", ["parentbased_always_on", "always_on"])
def test_a_turn_not_sampled_is_dropped_as_its_sampler_says(tmp_path: Path, sampler: str) -> None:
    """An agent's turn whose trace is not sampled: workers under the default parent-based
    sampler build no take and no handler span for it (and pass its context on in the lease);
    under a sampler that samples whatever the parent says, both are exported, children of the
    turn. A sampled turn after it is exported either way: the sync that the first's spans,
    ended before its own in each process, would have come by then."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from pending_actions.producers import PendingActions

    unsampled, sampled = (TracerProvider(sampler=s).get_tracer("agent")
                          for s in (ALWAYS_OFF, None))
    with receiver() as otlp, cluster(tmp_path, workers=0) as (server, workers, _pa):
        workers.append(Worker(server.url, overrides=FAST, log_path=tmp_path / "worker.log",
                              env={**otlp.env("workers"), "OTEL_TRACES_SAMPLER": sampler}
                              ).start())
        pa = PendingActions.from_url(server.url)
        turns: dict[str, tuple[str, Any]] = {}
        try:
            for name, tracer in (("unsampled", unsampled), ("sampled", sampled)):
                action_id = pa.stage(session=name, tool="edit", label="L", apply="t.ok")
                with tracer.start_as_current_span("turn") as turn:
                    assert not pa.resolve(session=name, action="apply", reason="r").is_error
                turns[name] = (action_id, turn.get_span_context())
        finally:
            pa.close()
        for name, (action_id, turn) in turns.items():
            assert turn.trace_flags.sampled is (name == "sampled")
            if name == "unsampled" and sampler.startswith("parentbased"):
                continue
            take = otlp.one(TAKE, action_id=action_id)
            apply = otlp.one(APPLY, action_id=action_id)
            assert (take.trace_id, take.parent_id) == (f"{turn.trace_id:032x}",
                                                       f"{turn.span_id:016x}")
            assert child_of(apply, take)
        dropped = turns["unsampled"][0]
        seen = [s.name for s in otlp.spans
                if s.attributes.get("pending_actions.action_id") == dropped]
        assert sorted(seen) == ([] if sampler.startswith("parentbased") else [APPLY, TAKE]), seen
