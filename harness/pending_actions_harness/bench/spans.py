"""What tracing adds to one handler run inside a dramatiq process, in microseconds: the
worker's own ``tracing.handling`` around a handler that does nothing, its outcome recorded,
each run under a lease of its own context (as each resolve's take writes one).

Run as ``python -m pending_actions_harness.bench.spans N`` in a process of its own, since a
provider, once set, is the process's for good: first with none (a worker without ``OTEL_*``
variables: the context is only passed on), then with the SDK's default provider and sampler
exporting to a sink that takes everything, for leases whose resolve was not sampled and for
leases whose resolve was. Prints a JSON object: median microseconds a run for each of
``none``, ``unsampled``, ``sampled``."""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Sequence

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from pending_actions.broker import tracing
from pending_actions.broker.atomic.replies import BeginStatus, Begun
from pending_actions.broker.events import Event
from pending_actions.broker.models import Lease, Spec

ROUNDS = 5  # each figure is the median of this many rounds of N runs


class _Sink(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _begun(rng: random.Random, flags: str) -> Begun:
    def context() -> str:
        return f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-{flags}"

    spec = Spec(id="pending-action:bench:1", session="bench", tool="bench", label="bench",
                apply="bench.noop", created_at=time.time(), trace=context())
    lease = Lease(id=spec.id, kind="action", token="t", attempt=1, req="r", action="apply",
                  deadline=0, state="running", trace=context())
    return Begun(BeginStatus.OK, lease, spec)


def _round(begun: list[Begun]) -> float:
    started = time.perf_counter()
    for one in begun:
        with tracing.handling("apply", one, time.time_ns(), None) as span:
            span.ended(Event.APPLIED, None, False)
    return (time.perf_counter() - started) / len(begun) * 1e6


def _median(n: int, flags: str) -> float:
    rng = random.Random(n)
    return statistics.median(_round([_begun(rng, flags) for _ in range(n)])
                             for _ in range(ROUNDS))


def main(argv: list[str]) -> None:
    n = int(argv[0])
    got = {"none": _median(n, "00")}
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Sink()))
    trace.set_tracer_provider(provider)
    got["unsampled"] = _median(n, "00")
    got["sampled"] = _median(n, "01")
    provider.shutdown()
    sys.stdout.write(orjson.dumps(got).decode())


if __name__ == "__main__":
    main(sys.argv[1:])
