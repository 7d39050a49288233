"""What tracing costs (issue 33): idle resolve p50 and loaded throughput with OpenTelemetry
absent, installed but not configured, exported by the workers only, and exported by the
workers and the callers to a local OTLP receiver, alternating round after round, each run
on a fresh Redis and worker.

    python -m pending_actions_harness.bench.tracing_cost [--rounds 3] [--idle 100]
        [--callers 32] [--per-caller 100] [--out FILE]

"absent" runs every process of the run (the callers' and the workers') with the import of
``opentelemetry`` made to fail, as where the extra is not installed; "exporting" gives the
workers the standard OTEL_* variables and the callers a provider of their own (as an agent
that traces sets up), both sending to a receiver in this process that answers 200 and counts
what it got; "workers" gives only the workers those variables."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

# "workers": only the workers export (the callers, an agent elsewhere in production, do not)
MODES = ("absent", "unconfigured", "workers", "exporting")
# a package of that name first on the path whose import fails, as a missing one does
BLOCKER = "raise ImportError('opentelemetry is not installed here (tracing_cost: absent)')\n"


class Sink:
    """An OTLP/HTTP endpoint that takes everything and counts it."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                self.rfile.read(size)
                sink.requests += 1
                sink.bytes += size
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def one(mode: str, idle: int, callers: int, per_caller: int) -> dict[str, Any]:
    """One run in this process (a child of ``main``'s, with its mode's environment)."""
    from pending_actions_harness.bench.campaign import fresh_run

    if mode == "exporting":  # the agent's own provider, as one that traces sets up
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    return fresh_run(mode, "cost", processes=1, settings=None, idle=idle, gaps_s=(0.02, 0.06),
                     callers=callers, per_caller=per_caller)


def run_mode(mode: str, sink: Sink, blocker: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PENDING_"))}
    if mode == "absent":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(blocker),
                                                        env.get("PYTHONPATH", "")) if p)
    if mode in ("workers", "exporting"):
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint, OTEL_SERVICE_NAME="cost")
    done = subprocess.run([sys.executable, "-m", __spec__.name, "--one", mode,
                           "--idle", str(args.idle), "--callers", str(args.callers),
                           "--per-caller", str(args.per_caller)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    got: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=100)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--per-caller", type=int, default=100)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(orjson.dumps(one(args.one, args.idle, args.callers, args.per_caller)).decode())
        return
    sink = Sink()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        blocker = Path(tmp)
        (blocker / "opentelemetry").mkdir()
        (blocker / "opentelemetry" / "__init__.py").write_text(BLOCKER)
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                runs[mode].append(run_mode(mode, sink, blocker, args))
                print(f"round {r + 1} {mode}: {runs[mode][-1]}", flush=True)
    summary: dict[str, Any] = {}
    for mode, got in runs.items():
        summary[mode] = {k: {"median": statistics.median(g[k] for g in got),
                             "min": min(g[k] for g in got), "max": max(g[k] for g in got)}
                         for k in got[0]}
    summary["sink"] = {"requests": sink.requests, "bytes": sink.bytes}
    text = orjson.dumps({"summary": summary, "runs": runs}, option=orjson.OPT_INDENT_2)
    if args.out:
        args.out.write_bytes(text)
    print(text.decode())


if __name__ == "__main__":
    main()
