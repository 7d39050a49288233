"""Flame graphs of every process of a resolve, recorded from outside by py-spy (the process runs
unchanged): the caller (this process), the resolve worker and the dramatiq worker process, on
the idle path (one resolve at a time, after a short pause) and the loaded one (32 callers).

``python -m pending_actions_harness.bench.profile --out DIR`` (needs ``py-spy`` on PATH and
the right to attach to a process: root, or ptrace allowed) writes ``idle-<process>.svg`` and
``loaded-<process>.svg`` to DIR (``.txt`` of collapsed stacks with ``--format raw``), on a
private Redis under ``appendfsync always`` with one ``pending-actions worker`` of 1 dramatiq
process x 8 threads. py-spy samples a thread while it runs and while it waits in a call it
does not know as idle (a socket read, here): each graph shows both."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import click

from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions_harness.bench import fill, measure
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.procs import start_ours

RATE = 2000  # samples a second: an idle resolve is a few ms of CPU over three processes


def _record(pids: dict[str, int], out: Path, stem: str,
            form: str) -> list[subprocess.Popen[bytes]]:
    suffix = "svg" if form == "flamegraph" else "txt"
    return [subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", str(RATE),
                              "--format", form, "--nonblocking", "--output",
                              str(out / f"{stem}-{name}.{suffix}")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for name, pid in pids.items()]


def _stop(recorders: list[subprocess.Popen[bytes]]) -> None:
    for proc in recorders:
        proc.send_signal(signal.SIGINT)  # py-spy writes its graph on SIGINT
    for proc in recorders:
        _out, err = proc.communicate(timeout=120)
        if proc.returncode not in (0, -signal.SIGINT):
            raise click.ClickException(f"py-spy failed: {err.decode(errors='replace')[-500:]}")


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where the SVG flame graphs go.")
@click.option("--idle", "idle_n", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Idle resolves, each after a pause of 5-20 ms.")
@click.option("--loaded", "loaded_n", type=click.IntRange(min=1), default=300,
              show_default=True, help="Resolves per caller, 32 callers.")
@click.option("--format", "form", type=click.Choice(["flamegraph", "raw"]),
              default="flamegraph", show_default=True,
              help="SVG flame graphs, or raw: py-spy's collapsed stacks as text (.txt), a line "
              "a stack with its sample count, to read or sum with other tools.")
def main(out: Path, idle_n: int, loaded_n: int, form: str) -> None:
    """Record flame graphs of a resolve's processes, idle and loaded."""
    if shutil.which("py-spy") is None:
        raise click.ClickException("py-spy is not on PATH (pip install py-spy)")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pa-profile-") as data:
        server = EmbeddedRedis(directory=Path(data), fsync="always").start()
        url = f"redis://127.0.0.1:{server.port}/0"
        ours = start_ours(url, 1, 8, out / "logs")
        pa = PendingActions.from_url(url)
        try:
            [worker] = ours.workers
            pids = {"caller": os.getpid(), "resolver": worker.pid,
                    "dramatiq": worker.dramatiq_pids[0]}
            payload = fill.payload_of(256)
            call = measure.resolver(pa, "profile-idle")
            for _ in range(20):  # scripts load, connections open
                pa.stage(session="profile-idle", tool="bench", label="bench", apply=NOOP,
                         payload=payload)
                call()
            fill.stage_bulk(pa, fill.cycle(["profile-idle"], idle_n), idle_n, payload, 1000,
                            lambda _n: None)
            rng = random.Random(1)
            recorders = _record(pids, out, "idle", form)
            try:
                for _ in range(idle_n):
                    time.sleep(rng.uniform(0.005, 0.02))
                    call()
            finally:
                _stop(recorders)
            names = [f"profile-load-{i}" for i in range(32)]
            fill.stage_bulk(pa, fill.cycle(names, loaded_n), 32 * loaded_n, payload, 1000,
                            lambda _n: None)
            calls = [measure.resolver(pa, n) for n in names]
            recorders = _record(pids, out, "loaded", form)
            try:
                dist = measure.loaded("loaded", calls, loaded_n, lambda _n: None)
            finally:
                _stop(recorders)
            ours.check_alive()
            click.echo(f"loaded: {dist.throughput:,.0f} resolves/s; graphs in {out}")
        finally:
            pa.close()
            ours.stop()
            server.stop()


if __name__ == "__main__":
    main()
