"""What the optional features cost, each a few rows of the one run: a stage with a 50-rule
policy beside one with none, a policy's glob on the worst 64 KiB payload string a model could
write, an idle resolve with the workers exporting traces beside the run's idle resolve, and a
read and a resolve through ``mcp-proxy`` beside the same read sent straight to the upstream.

Each was a campaign of its own once (``docs/benchmarks.md`` keeps their figures); here they are
kept small enough for the quick run. The tracing and MCP figures need their extras (and, for
MCP, the tests' file server of a checkout): without them they are skipped with the reason."""

from __future__ import annotations

import importlib.util
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pending_actions.broker.keys import Keys
from pending_actions.broker.policy.rules import Policy
from pending_actions.broker.routing import heartbeat
from pending_actions.procs import ROOT, StreamWatch, child_env
from pending_actions.producers import PendingActions
from pending_actions_harness.bench import fill, measure
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.procs import start_ours
from pending_actions_harness.bench.progress import Progress
from pending_actions_harness.bench.stats import Dist
from pending_actions_harness.bench.throughput import flush
from pending_actions_harness.supervise import WorkerProcess

POLICY_DB, MCP_DB, TRACING_DB = 5, 6, 7  # of the run's private redis-server, flushed first
POLICY_ROUNDS = 3  # no policy and 50 rules alternate in blocks, this many of each
GLOB_SIZE = 65_536  # characters of the payload string each glob decides
GLOB_SMALL = 1_024  # the baseline: the same glob on a string this long
PHASES = 8  # progress phases of ``run``: policy, globs, tracing (5), MCP

# (glob, the string of n characters it is decided against): each made to cost the most for its
# kind of glob. None matches: a match found early ends the search early. Where a run of the glob
# has a literal stretch the string holds it again and again, each time where the rest of the run
# fails, so that str.find's few places all miss.
GLOBS: list[tuple[str, Callable[[int], str]]] = [
    ("*sudo *rm *-rf*", lambda n: ("sudo rm " * n)[:n]),
    ("*a*a*a*a*a*a*a*a*b*", lambda n: "a" * n),
    ("*[sS][uU][dD][oO] *[rR][mM] *-[rR][fF]*", lambda n: ("SUDO rM -x " * n)[:n]),
    ("*" + "?a" * 20 + "b*", lambda n: ("a" * 30 + "b") * (n // 31)),
    ("*" + "[a-z]" * 30 + "0*", lambda n: ("a" * 20 + "0") * (n // 21)),
    ("*" + "ab" * 500 + "c*", lambda n: ("ab" * n)[:n]),
    ("*[sS]udo?rm*-rf*", lambda n: ("xudo\U0001f600rm " * n)[:n]),
    ("*[пП]ароль[=:]?[!ж-я]*", lambda n: ("Жароль=1 " * n)[:n]),
    ("*[?&]token=*", lambda n: ("xtoken=ж? " * n)[:n]),
    ("*\U0001f600[!\U0001f600]\U0001f600*", lambda n: "\U0001f600" * n),
]


def run(r: Any, base: str, logs: Path, progress: Progress) -> None:
    """Every feature's figures into ``r.dists`` and ``r.facts``; an optional one that cannot
    run is in ``r.skipped`` with the reason."""
    policy(r, f"{base}/{POLICY_DB}", progress)
    globs(r, progress)
    optional(r, "tracing", tracing_unavailable(), 5, progress,
             lambda: tracing(r, f"{base}/{TRACING_DB}", logs, progress))
    optional(r, "mcp", mcp_unavailable(), 1, progress,
             lambda: mcp(r, f"{base}/{MCP_DB}", logs, progress))


def optional(r: Any, name: str, why: str | None, phases: int, progress: Progress,
             measure_it: Callable[[], None]) -> None:
    """An optional feature's figures: skipped with ``why`` when its extra is missing (its
    ``phases`` counted done), or with what it raised; the rest of the run goes on either way."""
    if why:
        r.skipped[name] = why
        progress.done += phases
        return
    try:
        measure_it()
    except Exception as exc:  # an optional feature: say why, keep the run
        r.skipped[name] = f"failed: {exc!r}"[:300]
        progress.say(f"{name} figures failed: {exc!r}")


# --- policies --------------------------------------------------------------------------------
def fifty_rules() -> dict[str, Any]:
    """50 rules of the kinds a deployment writes: named tools, tool globs, payload paths,
    every decision; the action staged below matches a late allow rule, after every deny and
    ask rule that names its tool or a glob that admits it was looked at."""
    rules: list[dict[str, Any]] = []
    for i in range(20):  # other tools
        rules.append({"name": f"tool-{i}", "match": {"tool": f"tool_{i}"},
                      "decision": ("deny", "ask", "allow")[i % 3]})
    for i in range(10):  # globs that admit the staged tool, payloads that do not match
        rules.append({"name": f"glob-deny-{i}", "match": {
            "tool": "e*", "payload": {f"config.key{i}": f"prod-*{i}", "env": "prod"}},
            "decision": "deny", "reason": "no"})
    for i in range(10):
        rules.append({"name": f"glob-ask-{i}", "match": {
            "tool": "*", "label": f"*deploy {i}*", "payload": {"replicas": i + 10}},
            "decision": "ask", "approvals": 1 + i % 3})
    for i in range(9):
        rules.append({"name": f"path-{i}", "match": {"tool": "ed?t",
                                                     "payload": {f"items.{i}.name": "x*"}},
                      "decision": "allow", "auto": True})
    rules.append({"name": "edits", "match": {"tool": "edit"}, "decision": "allow"})
    return {"default": "ask", "rules": rules}


def policy(r: Any, url: str, progress: Progress) -> None:
    """Stage latency in a tenant with the 50-rule policy and in one with none, one client,
    the two alternating in blocks, every stage timed alone; ``policy.stage.ruled`` and
    ``policy.stage.plain`` hold every block's stages, ``facts["policy"]`` each block's p50."""
    n = r.sizes.policy_stages
    flush(url)
    pa = PendingActions.from_url(url)
    try:
        heartbeat(pa.client, pa.ctx.keys, "bench", [NOOP], "bench", 3_600_000)
        pa.set_policy(fifty_rules(), tenant="ruled")
        payload = {"path": "src/app.py", "config": {"key1": "dev"}, "replicas": 2,
                   "items": [{"name": "a"}, {"name": "b"}], "diff": "x" * 200}
        dists = {t: Dist(f"stage, {t}") for t in ("plain", "ruled")}
        blocks: dict[str, list[float]] = {"plain": [], "ruled": []}

        def block(tenant: str, count: int, into: Dist | None) -> None:
            took = []
            for i in range(count):
                started = time.perf_counter()
                pa.stage(session=f"{tenant}-{i % 50}", tool="edit", label="Fix a typo",
                         apply=NOOP, payload=payload, tenant=tenant)
                took.append(time.perf_counter() - started)
            if into is not None:
                for t in took:
                    into.add_seconds(t)
                blocks[tenant].append(statistics.median(took) * 1000)

        with progress.phase("policies: stage with 50 rules and with none",
                            2 * n * POLICY_ROUNDS) as tick:
            for tenant in ("plain", "ruled"):  # warm: ids, the policy read once, scripts
                block(tenant, 50, None)
            for i in range(POLICY_ROUNDS):
                for tenant in ("plain", "ruled") if i % 2 == 0 else ("ruled", "plain"):
                    block(tenant, n, dists[tenant])
                    tick(n)
        r.dists["policy.stage.plain"], r.dists["policy.stage.ruled"] = (
            dists["plain"], dists["ruled"])
        ratios = [b / a for a, b in zip(blocks["plain"], blocks["ruled"], strict=True)]
        r.facts["policy"] = {"rules": 50, "stages_per_block": n, "blocks_p50_ms": blocks,
                             "block_ratios": ratios, "ratio": statistics.median(ratios)}
    finally:
        pa.close()
        flush(url)


def globs(r: Any, progress: Progress) -> None:
    """Each glob of ``GLOBS`` as a one-rule policy deciding its worst string through
    ``Policy.decide`` (a stage's path), the median of ``glob_repeat`` decisions, at
    ``GLOB_SIZE`` characters and at ``GLOB_SMALL``; the worst at the large size is the row."""
    repeat = r.sizes.glob_repeat
    each: list[dict[str, Any]] = []
    with progress.phase(f"policies: {len(GLOBS)} adversarial globs on {GLOB_SIZE // 1024} KiB",
                        len(GLOBS)) as tick:
        for glob, make in GLOBS:
            rule = {"name": "r", "match": {"payload": {"cmd": glob}}, "decision": "deny"}
            decide = Policy({"rules": [rule]}).decide
            got: dict[str, Any] = {"glob": glob}
            for size in (GLOB_SMALL, GLOB_SIZE):
                text = make(size)
                took = []
                for _ in range(repeat):
                    started = time.perf_counter()
                    decision = decide(tool="t", apply="h", label="l", session="s",
                                      payload={"cmd": text}).decision
                    took.append((time.perf_counter() - started) * 1000)
                if decision == "deny":  # each string is made so that its glob misses
                    raise AssertionError(f"glob {glob!r} matched its worst string")
                got[f"ms_{size}"] = statistics.median(took)
            each.append(got)
            tick(1)
    worst = max(each, key=lambda g: g[f"ms_{GLOB_SIZE}"])
    r.facts["globs"] = {"size": GLOB_SIZE, "small": GLOB_SMALL, "repeat": repeat,
                        "globs": each, "worst": worst}


# --- tracing ---------------------------------------------------------------------------------
def tracing_unavailable() -> str | None:
    for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return f"{name} is not installed (pip install 'pending-actions[otel]')"
    return None


class Sink:
    """An OTLP/HTTP endpoint that takes everything, answers 200 and counts it."""

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

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tracing(r: Any, url: str, logs: Path, progress: Progress) -> None:
    """Idle resolves (``appendfsync always``) on a worker whose processes export every span
    from the standard ``OTEL_*`` variables to a local endpoint, as the run's idle resolves are
    measured; the callers keep no spans (an agent elsewhere in production). Then what tracing
    adds to one handler run, sampled and not, in a process of its own (``bench.spans``)."""
    s, o = r.sizes, r.options
    with progress.phase("tracing: a handler run's spans, sampled and not", 1) as tick:
        # the SDK's defaults: no OTEL_* of this process's (a sampler, say) in the child
        env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
        done = subprocess.run([sys.executable, "-m", "pending_actions_harness.bench.spans",
                               str(s.handler_spans)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600, check=True)
        r.facts["handler_spans_us"] = json.loads(done.stdout)
        tick(1)
    sink = Sink()
    try:
        with progress.phase("tracing: start workers exporting spans", o.processes + 1) as tick:
            flush(url)
            ours = start_ours(url, o.processes, o.threads, logs / "tracing",
                              env={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                                   "OTEL_SERVICE_NAME": "bench"})
            tick(o.processes + 1)
        try:
            pa = PendingActions.from_url(url)
            try:
                payload = fill.payload_of(s.payload_bytes)

                def stage() -> None:
                    pa.stage(session="bench-traced", tool="bench", label="bench action",
                             apply=NOOP, payload=payload)

                call = measure.resolver(pa, "bench-traced")
                for _ in range(3):  # scripts load, connections open, the exporter starts
                    stage()
                    call()
                with progress.phase("tracing: idle resolves, workers exporting", s.idle) as tick:
                    r.dists["tracing.idle"] = measure.idle("ours idle, exporting spans", call,
                                                           s.idle, s.idle_gap_s, tick,
                                                           before=stage)
                # the batch processor exports every 5 s: wait for one, so that the figure is
                # known to be of spans sent
                deadline = time.monotonic() + 10
                with progress.phase("tracing: the workers' first export", 1) as tick:
                    while not sink.requests and time.monotonic() < deadline:
                        time.sleep(0.1)
                    tick(1)
            finally:
                pa.close()
            ours.check_alive()
        finally:
            ours.kill()
        r.facts["tracing"] = {"exports": sink.requests, "bytes": sink.bytes}
        sampled_loaded(r, url, logs, progress, sink)
    finally:
        sink.close()
        flush(url)


def sampled_loaded(r: Any, url: str, logs: Path, progress: Progress, sink: Sink) -> None:
    """Loaded throughput with the workers exporting a tenth of the traces
    (``parentbased_traceidratio`` 0.1: the callers carry no context, so each take is a root
    the ratio decides, and its handler span follows it) against workers with no ``OTEL_*``
    set: each block on workers of its own, the two kinds alternating, ``sampled_blocks``
    of each. ``facts["tracing_loaded"]``: each kind's throughput, block by block."""
    s, o = r.sizes, r.options
    envs: dict[str, dict[str, str]] = {
        "off": {}, "sampled": {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                               "OTEL_SERVICE_NAME": "bench", "OTEL_BSP_SCHEDULE_DELAY": "500",
                               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                               "OTEL_TRACES_SAMPLER_ARG": "0.1"}}
    blocks = s.sampled_blocks
    got: dict[str, list[float]] = {kind: [] for kind in envs}
    names = [f"bench-sampled-{i}" for i in range(s.callers)]
    with progress.phase("tracing: loaded, a tenth sampled and none",
                        2 * 2 * blocks * s.callers * (s.per_caller + 2)) as tick:
        for i in range(blocks):
            for kind in ("off", "sampled") if i % 2 == 0 else ("sampled", "off"):
                flush(url)
                ours = start_ours(url, o.processes, o.threads, logs / f"tracing-{kind}-{i}",
                                  env=envs[kind])
                try:
                    pa = PendingActions.from_url(url)
                    try:
                        calls = fill.loaded_callers(pa, names, s.per_caller,
                                                    s.payload_bytes, tick)
                        dist = measure.loaded(f"loaded, {kind}", calls, s.per_caller, tick)
                    finally:
                        pa.close()
                    ours.check_alive()
                finally:
                    ours.kill()
                if dist.errors:
                    raise RuntimeError(f"{dist.errors} loaded resolves failed ({kind})")
                got[kind].append(dist.throughput)
    r.facts["tracing_loaded"] = got


# --- MCP -------------------------------------------------------------------------------------
UPSTREAM = ROOT / "tests" / "support" / "mcp_upstream.py"  # the tests' file server
MCP_WARMUP = 5


def mcp_unavailable() -> str | None:
    if importlib.util.find_spec("mcp") is None:
        return "mcp is not installed (pip install 'pending-actions[mcp]')"
    if not UPSTREAM.exists():
        return f"no upstream to measure with: {UPSTREAM} is in a checkout only"
    return None


def mcp(r: Any, url: str, logs: Path, progress: Progress) -> None:
    """A worker with the tests' file server as upstream, ``mcp-proxy`` and a direct client of
    that server, as real processes: reads sent straight and through the proxy one after the
    other, then staged writes each applied with ``resolve`` through the proxy (timed to its
    answer, and to the upstream's write as the upstream records it)."""
    import anyio

    s = r.sizes
    with progress.phase("MCP: reads straight and through mcp-proxy, resolves through it",
                        s.mcp_reads + s.mcp_applies) as tick:
        flush(url)
        with tempfile.TemporaryDirectory(prefix="pa-bench-mcp-") as tmp:
            folder = Path(tmp)
            upstream = [sys.executable, "-m", "tests.support.mcp_upstream", str(folder)]
            worker = WorkerProcess(url, "pending_actions.workers.examples",
                                   log_path=logs / "mcp-worker.log")
            worker.child.argv += ["--mcp-upstream", "files=" + shlex.join(upstream)]
            watch = StreamWatch(url, Keys().workers)  # opened first: no ready event missed
            try:
                # the reads need no worker: it boots while the clients start and read
                worker.launch()

                def ready() -> None:
                    worker.wait_ready(timeout=60, watch=watch)

                found = anyio.run(_mcp_run, folder, upstream, url, s.mcp_reads, s.mcp_applies,
                                  ready, tick)
            finally:
                watch.close()
                worker.kill()  # every call was answered: nothing to wait for
                flush(url)
    r.dists.update(found)


@asynccontextmanager
async def _client(argv: list[str], env: dict[str, str]) -> AsyncIterator[Any]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=ROOT)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _mcp_run(folder: Path, upstream: list[str], url: str, reads: int, applies: int,
                   ready: Callable[[], None], tick: Callable[[int], None]) -> dict[str, Dist]:
    import anyio.to_thread

    env = child_env({"PENDING_ACTIONS_REDIS_URL": url})
    proxy = [sys.executable, "-m", "pending_actions", "mcp-proxy", "--session", "bench",
             "--upstream", "files", "--mcp-upstream", f"files={shlex.join(upstream)}"]
    (folder / "read.txt").write_text("x" * 100)
    out = {k: Dist(k) for k in ("mcp.read.direct", "mcp.read.proxied", "mcp.resolve",
                                "mcp.resolve.to_write")}
    async with _client(upstream, env) as direct, _client(proxy, env) as through:
        read = {"path": "read.txt"}
        for n in range(MCP_WARMUP + reads):
            started = time.perf_counter()
            await direct.call_tool("read_file", read)
            middle = time.perf_counter()
            await through.call_tool("read_file", read)
            if n >= MCP_WARMUP:
                out["mcp.read.direct"].add_seconds(middle - started)
                out["mcp.read.proxied"].add_seconds(time.perf_counter() - middle)
                tick(1)
        await anyio.to_thread.run_sync(ready)
        log = folder / ".writes.jsonl"
        for n in range(MCP_WARMUP + applies):
            staged = await through.call_tool("write_file", {"path": f"w{n}.txt", "text": "y"})
            if staged.is_error:
                raise RuntimeError(f"write_file through mcp-proxy failed: {staged}")
            sent, started = time.time(), time.perf_counter()
            done = await through.call_tool("resolve", {"action": "apply", "reason": "bench"})
            took = time.perf_counter() - started
            if done.is_error:
                raise RuntimeError(f"resolve through mcp-proxy failed: {done}")
            written = json.loads(log.read_text().splitlines()[-1])
            if written["path"] != f"w{n}.txt":
                raise RuntimeError(f"the upstream wrote {written['path']}, not w{n}.txt")
            if n >= MCP_WARMUP:
                out["mcp.resolve"].add_seconds(took)
                out["mcp.resolve.to_write"].add_seconds(float(written["at"]) - sent)
                tick(1)
    return out
