"""What the MCP proxy costs (docs/mcp.md): a forwarded read through ``mcp-proxy`` beside the
same read sent straight to the upstream (interleaved, one after the other, in the same run), and
the time from a ``resolve`` sent to the proxy to the upstream's write, as the upstream records
it. Each run starts its own Redis, a worker with the upstream, the proxy and a direct client,
all as real processes; the upstream is the tests' file server (tests/support/mcp_upstream.py),
so this runs from a checkout:

    python -m pending_actions_harness.mcp_bench [--runs 3] [--reads 300] [--applies 30]

Prints each run's medians, then across runs the median and the range of those medians."""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import click

from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT, child_env
from pending_actions_harness.supervise import WorkerProcess

try:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
except ImportError as exc:  # pragma: no cover
    raise SystemExit(f"the MCP benchmark needs the 'mcp' extra ({exc.name} is missing): "
                     "pip install 'pending-actions[mcp]'") from None

WARMUP = 5


@asynccontextmanager
async def client(argv: list[str], env: dict[str, str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=ROOT)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 3)


async def one_run(folder: Path, url: str, reads: int, applies: int) -> dict[str, float]:
    upstream = [sys.executable, "-m", "tests.support.mcp_upstream", str(folder)]
    env = child_env({"PENDING_ACTIONS_REDIS_URL": url})
    proxy = [sys.executable, "-m", "pending_actions", "mcp-proxy", "--session", "bench",
             "--upstream", "files", "--mcp-upstream", f"files={shlex.join(upstream)}"]
    (folder / "read.txt").write_text("x" * 100)
    direct_s: list[float] = []
    proxied_s: list[float] = []
    to_write_s: list[float] = []
    resolve_s: list[float] = []
    async with client(upstream, env) as direct, client(proxy, env) as through:
        read = {"path": "read.txt"}
        for n in range(WARMUP + reads):
            started = time.perf_counter()
            await direct.call_tool("read_file", read)
            middle = time.perf_counter()
            await through.call_tool("read_file", read)
            if n >= WARMUP:
                direct_s.append(middle - started)
                proxied_s.append(time.perf_counter() - middle)
        log = folder / ".writes.jsonl"
        for n in range(WARMUP + applies):
            staged = await through.call_tool("write_file", {"path": f"w{n}.txt", "text": "y"})
            assert not staged.is_error, staged
            sent, started = time.time(), time.perf_counter()
            done = await through.call_tool("resolve", {"action": "apply", "reason": "bench"})
            took = time.perf_counter() - started
            assert not done.is_error, done
            written = json.loads(log.read_text().splitlines()[-1])
            assert written["path"] == f"w{n}.txt"
            if n >= WARMUP:
                to_write_s.append(float(written["at"]) - sent)
                resolve_s.append(took)
    return {"direct_read_ms": ms(direct_s), "proxied_read_ms": ms(proxied_s),
            "overhead_ms": round(ms(proxied_s) - ms(direct_s), 3),
            "resolve_to_write_ms": ms(to_write_s), "resolve_round_trip_ms": ms(resolve_s)}


def measure(runs: int, reads: int, applies: int) -> list[dict[str, float]]:
    found = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp:
            folder = Path(tmp) / "files"
            folder.mkdir()
            server = EmbeddedRedis(directory=Path(tmp) / "redis").start()
            worker = WorkerProcess(server.url, "pending_actions.workers.examples",
                                   log_path=Path(tmp) / "worker.log")
            worker.child.argv += ["--mcp-upstream", "files=" + shlex.join(
                [sys.executable, "-m", "tests.support.mcp_upstream", str(folder)])]
            try:
                worker.start()
                found.append(anyio.run(one_run, folder, server.url, reads, applies))
            finally:
                worker.stop()
                server.stop()
    return found


def summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {key: {"median": statistics.median(r[key] for r in runs),
                  "min": min(r[key] for r in runs), "max": max(r[key] for r in runs)}
            for key in runs[0]}


@click.command()
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--reads", type=click.IntRange(min=1), default=300, show_default=True,
              help="Reads per run, each sent straight and through the proxy.")
@click.option("--applies", type=click.IntRange(min=1), default=30, show_default=True,
              help="Staged writes applied with resolve per run.")
@click.option("--json", "as_json", is_flag=True)
def main(runs: int, reads: int, applies: int, as_json: bool) -> None:
    """Measure mcp-proxy: forwarded reads against direct ones, resolve to the upstream's write."""
    found = measure(runs, reads, applies)
    total = summary(found)
    if as_json:
        click.echo(json.dumps({"runs": found, "summary": total}, indent=2))
        return
    for n, run in enumerate(found, 1):
        click.echo(f"run {n}: " + ", ".join(f"{k} {v:g}" for k, v in run.items()))
    for key, value in total.items():
        click.echo(f"{key}: median {value['median']:g} (range {value['min']:g}-"
                   f"{value['max']:g})")


if __name__ == "__main__":
    main()
