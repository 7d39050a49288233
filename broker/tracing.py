"""OpenTelemetry, the one module that imports it: what crosses Redis (one string, the W3C trace
context), the spans of a stage, a resolve, a take, a handler run and a recovery, worker log
lines with their trace and span ids, and the SDK's set up in the processes we run.

Without the API installed (the ``otel`` extra, or anything else that brings it) every function
here does nothing. With it but no provider set (the agent's process configures none, a worker
has no ``OTEL_*`` variables) spans are non-recording: a client still carries a context its
caller has, and writes nothing when there is none. docs/design.md (Tracing) has the design."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pending_actions.broker.atomic.replies import Begun, Taken
from pending_actions.broker.events import Event
from pending_actions.broker.models import Lease, ResolveRequest

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
    _propagator = TraceContextTextMapPropagator()
    _tracer = _trace.get_tracer("pending_actions")  # a proxy: follows a provider set later
except ImportError:  # the extra is not installed
    AVAILABLE = False

log = logging.getLogger("pending_actions.tracing")

# span names and attributes (CONTRACT section 8); an outcome is a broker/events.py name
STAGE, RESOLVE, TAKE = "pending_actions.stage", "pending_actions.resolve", "pending_actions.take"
APPLY, REJECT = "pending_actions.apply", "pending_actions.reject"
RECOVER, EXPIRE = "pending_actions.recover", "pending_actions.expire"
SESSION, ACTION_ID = "pending_actions.session", "pending_actions.action_id"
TOOL, OUTCOME = "pending_actions.tool", "pending_actions.outcome"
ATTEMPT, COUNT = "pending_actions.attempt", "pending_actions.count"
ACTION, TAKE_STATUS = "pending_actions.action", "pending_actions.take"
POLICY_DECISION, POLICY_RULE = "pending_actions.policy.decision", "pending_actions.policy.rule"
QUEUED_MS, STARTED = "pending_actions.queued_ms", "pending_actions.started"
DEQUEUED, READD = "pending_actions.dequeued", "pending_actions.readd"

Attributes = Mapping[str, str | int | bool]


# --- what crosses Redis ----------------------------------------------------------------------
def carried(span: Any = None) -> str | None:
    """The context of ``span`` (else of the current span) as one string: ``traceparent``, then
    a space and ``tracestate`` when there is one (a traceparent has no space). None when there
    is no valid context: nothing is then written anywhere."""
    if not AVAILABLE:
        return None
    span = span if span is not None else _trace.get_current_span()
    context = span.get_span_context()
    if not context.is_valid:
        return None
    # the W3C form the standard propagator writes (version 00), without its carrier and context
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    # a tracestate past the W3C's 512 characters is dropped, as a propagator may
    return f"{parent} {state}" if state and len(state) <= 512 else parent


def context_of(text: str | None) -> Any:
    """The context a carried string stands for; None for none (or without the API)."""
    if not AVAILABLE or not text:
        return None
    return _extracted(text)


# a version-00 traceparent, all that carried() writes: read without the propagator's general
# parse (any other form, and one with a tracestate, goes through it)
_PARENT_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@functools.lru_cache(maxsize=256)
def _extracted(text: str) -> Any:
    # contexts are immutable: a handler run's start and its span read the lease's one string
    parent, _, state = text.partition(" ")
    plain = None if state else _PARENT_00.fullmatch(parent)
    if plain is not None:
        trace_id, span_id = int(plain[1], 16), int(plain[2], 16)
        if trace_id and span_id:  # all zeros is invalid: the propagator's empty context
            return _trace.set_span_in_context(_trace.NonRecordingSpan(_trace.SpanContext(
                trace_id, span_id, is_remote=True,
                trace_flags=_trace.TraceFlags(int(plain[3], 16)))), _context.Context())
    return _propagator.extract({"traceparent": parent, **({"tracestate": state} if state
                                                          else {})})


def _span_context(text: str | None) -> Any:
    found = context_of(text)
    context = _trace.get_current_span(found).get_span_context() if found is not None else None
    return context if context is not None and context.is_valid else None


def recording() -> bool:
    """Whether this process has a provider set (ours or another's), so that spans are kept."""
    return AVAILABLE and not isinstance(_trace.get_tracer_provider(),
                                        _trace.ProxyTracerProvider | _trace.NoOpTracerProvider)


# --- the clients' spans ----------------------------------------------------------------------
@contextmanager
def current(name: str, attributes: Attributes) -> Iterator[None]:
    """A span of the client's (``stage``, ``resolve``), current while the body runs, so that
    the plan carries its context (``carried()``); an error raised records itself on it."""
    if not AVAILABLE:
        yield
        return
    with _tracer.start_as_current_span(name, attributes=attributes):
        yield


def annotate(attributes: Attributes) -> None:
    """Attributes on the current span (the client's, while its plan runs)."""
    if AVAILABLE:
        span = _trace.get_current_span()
        if span.is_recording():
            span.set_attributes(attributes)


def staged(specs: Sequence[Mapping[str, Any]]) -> None:
    """The stage span's attributes: the session and tool of its actions (when they share
    them), the first action's id, and how many."""
    sessions, tools = {s["session"] for s in specs}, {s["tool"] for s in specs}
    annotate({**({SESSION: next(iter(sessions))} if len(sessions) == 1 else {}),
              **({TOOL: next(iter(tools))} if len(tools) == 1 else {}),
              ACTION_ID: specs[0]["id"], COUNT: len(specs)})


def errored(description: str) -> None:
    """The current span (the client's resolve) came to an error result."""
    if AVAILABLE:
        _trace.get_current_span().set_status(_trace.StatusCode.ERROR, description)


def policy_decided(verdicts: Sequence[Any]) -> None:
    """Where a stage's actions are decided (each a ``rules.Verdict``, None without a policy):
    the stage span's attributes. The decision (``auto`` for an allow applied at once) and the
    rule when all its actions share them; outcome ``denied`` when any was denied."""
    if not AVAILABLE or not any(verdicts):
        return
    decisions = {"auto" if v.auto else v.decision for v in verdicts if v is not None}
    rules = {v.rule for v in verdicts if v is not None}
    rule = next(iter(rules)) if len(rules) == 1 else None
    annotate({**({POLICY_DECISION: next(iter(decisions))} if len(decisions) == 1 else {}),
              **({POLICY_RULE: rule} if rule else {}),
              **({OUTCOME: "denied"} if "deny" in decisions else {})})


# --- the workers' spans ----------------------------------------------------------------------
def start(name: str, parent: str | None, attributes: Attributes,
          links: Sequence[str | None] = (), start_ns: int | None = None) -> Any:
    """A span whose parent is the carried context ``parent`` (a new trace without one), linked
    to each carried context of ``links``; None when this process keeps no spans."""
    if not recording():
        return None
    context = context_of(parent)
    if context is not None and _drops_unsampled():
        found_parent = _trace.get_current_span(context).get_span_context()
        if found_parent.is_valid and not found_parent.trace_flags.sampled:
            return None  # dropped by the sampler: no links parsed, no span built
    found = [c for c in map(_span_context, links) if c is not None]
    return _tracer.start_span(name, context=context, attributes=attributes,
                              links=[_trace.Link(c) for c in found], start_time=start_ns)


_dropping: tuple[Any, bool] = (None, False)  # (provider, whether its sampler drops, as below)


def _drops_unsampled() -> bool:
    """Whether this process's sampler drops every span whose (carried, so remote) parent is not
    sampled, whatever the span's name, attributes and links: the SDK's parent-based sampler with
    its default for such a parent (the SDK's default sampler, and every ``parentbased_*`` of
    ``OTEL_TRACES_SAMPLER``). Read off its description, once per provider; any other sampler
    is asked for every span, as the SDK asks it."""
    global _dropping
    provider = _trace.get_tracer_provider()
    if _dropping[0] is not provider:
        sampler = getattr(provider, "sampler", None)
        described = sampler.get_description() if sampler is not None else ""
        _dropping = (provider, described.startswith("ParentBased{")
                     and ",remoteParentNotSampled:AlwaysOffSampler," in described)
    return _dropping[1]


def end(span: Any, attributes: Attributes) -> None:
    if span is not None:
        span.set_attributes(attributes)
        span.end()


def now_ns() -> int:
    return time.time_ns()


class Takes:
    """The take spans of one batch of takes, one per request, each a child of its request's
    context; what each take writes into its lease (``trace(i)``): its span's context, or where
    this process keeps no spans, its request's, passed on as it came."""

    def __init__(self, requests: Sequence[ResolveRequest]) -> None:
        self.requests = requests
        self.spans = [start(TAKE, r.trace, {SESSION: r.session}) for r in requests]

    def trace(self, i: int) -> str:
        span = self.spans[i]
        return (carried(span) if span is not None else self.requests[i].trace) or ""

    def done(self, out: Sequence[Taken | Exception]) -> None:
        for span, got in zip(self.spans, out, strict=False):
            if isinstance(got, Exception):
                if span is not None:
                    span.record_exception(got)
                    span.set_status(_trace.StatusCode.ERROR)
                end(span, {})
            else:
                end(span, {TAKE_STATUS: got.status.value, **(
                    {ACTION_ID: got.id, ATTEMPT: got.attempt} if got.id else {})})
        for span in self.spans[len(out):]:
            end(span, {})


class Handling:
    """The span of one handler run (``handling``): ``ended`` says how it came out."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def ended(self, outcome: Event, error: BaseException | None, readd: bool) -> None:
        """``outcome``: what was recorded (late-refused when the lease had gone); a failure
        records what the handler raised; ``readd``: the action went back (the worker's
        ``conclusion`` decided so), an event."""
        span = self.span
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(_trace.StatusCode.ERROR, str(error) or type(error).__name__)
        if readd:
            span.add_event(READD)
        span.set_attribute(OUTCOME, outcome.value)


@contextmanager
def handling(action: str, begun: Begun, started_ns: int,
             queued_at_ms: int | None) -> Iterator[Handling]:
    """The handler's span (``pending_actions.apply`` or ``.reject``) from ``started_ns`` (before
    its claim), current while the handler runs and its outcome is recorded: a child of the
    lease's context (the deciding resolve's take), linked to the spec's (its stage); its
    task's time in the queue an event. Where this process keeps no spans, the lease's context
    is current all the same, so that the handler's own outgoing calls carry the resolve's
    trace."""
    assert begun.spec is not None and begun.lease is not None
    spec, lease = begun.spec, begun.lease
    span = start(APPLY if action == "apply" else REJECT, lease.trace, {
        SESSION: spec.session, ACTION_ID: spec.id, TOOL: spec.tool, ATTEMPT: lease.attempt},
        links=(spec.trace,), start_ns=started_ns)
    if span is None:
        found = context_of(lease.trace)
        token = _context.attach(found) if found is not None else None
        try:
            yield Handling(None)
        finally:
            if token is not None:
                _context.detach(token)
        return
    if queued_at_ms is not None:
        span.add_event(DEQUEUED, {QUEUED_MS: max(0, started_ns // 1_000_000 - queued_at_ms)},
                       timestamp=started_ns)
    with _trace.use_span(span, end_on_exit=True):
        yield Handling(span)


@contextmanager
def recovering(lease: Lease, session: str, dead: bool, started: bool) -> Iterator[None]:
    """Recovery's span for a lease it ended, in the trace of the resolve that took it, current
    for the log line that says so."""
    span = start(RECOVER, lease.trace, {
        SESSION: session, ACTION_ID: lease.id, ATTEMPT: lease.attempt, STARTED: started,
        OUTCOME: (Event.DEAD_LETTERED if dead else Event.RECOVERED).value})
    if span is None:
        yield
        return
    with _trace.use_span(span, end_on_exit=True):
        yield


def expired(session: str, action_id: str, staged_in: str | None) -> None:
    """Recovery ended an action whose ttl passed: a span of its own (no resolve decided it),
    linked to the context it was staged in, with outcome ``expired``."""
    end(start(EXPIRE, None, {SESSION: session, ACTION_ID: action_id,
                             OUTCOME: Event.EXPIRED.value}, links=(staged_in,)), {})


# --- the processes we run: export and logs ---------------------------------------------------
_provider: Any = None  # the provider ``setup`` made, flushed at a dramatiq process's shutdown
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """The ``opentelemetry_traces_exporter`` entry points the standard variables ask for:
    ``OTEL_TRACES_EXPORTER`` (comma separated; ``none`` for none), else ``otlp`` when an OTLP
    endpoint is set; ``otlp`` is HTTP/protobuf unless the protocol variable says grpc."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    asked = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not asked:
        asked = "otlp" if any(env.get(name) for name in _ENDPOINTS) else "none"
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip()
    otlp = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
    names = [n.strip() for n in asked.split(",") if n.strip() and n.strip() != "none"]
    return [otlp if n == "otlp" else n for n in names]


def setup(service: str) -> bool:
    """Export this process's spans as the standard ``OTEL_*`` variables say, through the SDK's
    own classes, each reading its variables (``Resource.create``: ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES``, ``service`` when neither names one; the sampler; the batch
    processor; the exporter's endpoint, headers, timeout). Also puts trace and span ids on our
    log lines (``log_ids``). Nothing when no exporter is asked for, when a provider is set
    already (``opentelemetry-instrument``), or without the SDK (one warning). Only for the
    processes we run: a client never sets a provider, the agent's process owns it."""
    global _provider
    names = exporter_names(os.environ)
    if not AVAILABLE:
        if names:
            log.warning("OTEL_* variables ask for traces but OpenTelemetry is not installed: "
                        "pip install 'pending-actions[otel]'")
        return False
    log_ids()
    if not names or not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        return False
    try:
        from importlib.metadata import entry_points

        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* variables ask for traces but the OpenTelemetry SDK is not "
                    "installed: pip install 'pending-actions[otel]'")
        return False
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    for name in names:
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            log.warning("no OpenTelemetry span exporter %r is installed; spans are not sent "
                        "there", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(next(iter(found)).load()()))
    _trace.set_tracer_provider(provider)
    _provider = provider
    log.info("tracing: spans of %s exported by %s", resource.attributes.get(SERVICE_NAME),
             ", ".join(names))
    return True


def flush(timeout_ms: int = 5000) -> None:
    """Send what this process's provider still holds: a dramatiq process ends without the
    ``atexit`` hook that would."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


class _Ids(logging.Filter):
    """Ends a record of our loggers made while a valid span is current with its ids; every
    other record is left as it is, so the handler's format is unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("pending_actions") and "trace_id" not in record.__dict__:
            context = _trace.get_current_span().get_span_context()
            if context.is_valid:
                ids = {"trace_id": f"{context.trace_id:032x}",
                       "span_id": f"{context.span_id:016x}"}
                record.msg = " ".join([record.getMessage(), *(f"{k}={v}" for k, v in
                                                             ids.items())])
                record.args = None
                record.__dict__.update(ids)  # for a format that names them
        return True


def log_ids() -> None:
    """Trace and span ids on our log lines, through every handler the root logger has now
    (set up by the CLI, or by dramatiq in its processes)."""
    if not AVAILABLE:
        return
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _Ids) for f in handler.filters):
            handler.addFilter(_Ids())
