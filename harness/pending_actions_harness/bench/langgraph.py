"""The peer a user would pick instead: LangGraph's human-in-the-loop on its Postgres
checkpointer. A one-node graph whose node calls ``interrupt`` with the action (the stage: the
graph runs to the interrupt and its checkpoint is written) and, once resumed with
``Command(resume="apply")``, applies it as a no-op (the resolve: the checkpoint is read, the
node runs in the caller's process, the final checkpoint is written). Measured beside ours in
the same run: stage p50, idle resume p50 (the same pauses as ours), resumes per second with
``CALLERS`` callers (the better of as many threads sharing a pool and as many processes), and
the bytes a waiting thread adds to the checkpoint tables.

Runs when ``langgraph``, ``langgraph-checkpoint-postgres`` and ``psycopg`` are installed and
a PostgreSQL answers at ``PENDING_ACTIONS_BENCH_POSTGRES`` (default the machine's own,
``postgresql://postgres@127.0.0.1:5432/postgres``); the run uses a database of its own,
``pending_actions_bench``, created when missing, and its server's settings as they are (the
defaults: every commit fsync'd). Also a worker of the threads' and processes' runs:
``python -m pending_actions_harness.bench.langgraph worker URL PREFIX N``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypedDict

import orjson

from pending_actions.procs import ROOT
from pending_actions_harness.bench import fill, measure
from pending_actions_harness.bench.progress import Progress, Tick
from pending_actions_harness.bench.stats import Dist

POSTGRES_URL = os.environ.get("PENDING_ACTIONS_BENCH_POSTGRES",
                              "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "pending_actions_bench"
CALLERS = 16
TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def unavailable(url: str = POSTGRES_URL) -> str | None:
    """Why the baseline cannot run here, or None."""
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return (f"needs {exc.name} (pip install -e './harness[langgraph]'), and a PostgreSQL")
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL at {url}: {str(exc).strip().splitlines()[0]}"
    return None


def database_url(url: str) -> str:
    """The run's own database on the server of ``url``, created when missing."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                        (DATABASE,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return make_conninfo(url, dbname=DATABASE)


class State(TypedDict, total=False):
    payload: dict[str, Any]
    result: str


def _act(state: State) -> State:
    from langgraph.types import interrupt

    decision = interrupt({"label": "bench action", "payload": state["payload"]})
    return {"result": "applied" if decision == "apply" else "discarded"}


class Peer:
    """The graph on a checkpointer over a pool of ``size`` connections."""

    def __init__(self, url: str, size: int = 1) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        self.pool: Any = ConnectionPool(url, min_size=size, max_size=size, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})
        saver = PostgresSaver(self.pool)
        saver.setup()
        graph: Any = StateGraph(State)
        graph.add_node("act", _act)
        graph.add_edge(START, "act")
        graph.add_edge("act", END)
        self.app: Any = graph.compile(checkpointer=saver)

    @staticmethod
    def thread(name: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": name}}

    def stage(self, name: str, payload: dict[str, Any]) -> float:
        start = time.perf_counter()
        out = self.app.invoke({"payload": payload}, self.thread(name))
        elapsed = time.perf_counter() - start
        if "__interrupt__" not in out:
            raise RuntimeError(f"the graph ran past its interrupt: {out!r}"[:200])
        return elapsed

    def resume(self, name: str) -> float:
        from langgraph.types import Command

        start = time.perf_counter()
        out = self.app.invoke(Command(resume="apply"), self.thread(name))
        elapsed = time.perf_counter() - start
        if out.get("result") != "applied":
            raise RuntimeError(f"the resume did not apply: {out!r}"[:200])
        return elapsed

    def table_bytes(self) -> int:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT " + " + ".join(
                f"pg_total_relation_size('{t}')" for t in TABLES) + " AS n").fetchone()
        return int(row["n"])

    def clear(self) -> None:
        with self.pool.connection() as conn:
            conn.execute(f"TRUNCATE {', '.join(TABLES)}")

    def settings(self) -> dict[str, str]:
        with self.pool.connection() as conn:
            rows = conn.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                "('fsync', 'synchronous_commit', 'server_version')").fetchall()
        return {r["name"]: r["setting"] for r in rows}

    def close(self) -> None:
        self.pool.close()


def run(url: str, sizes: Any, progress: Progress) -> tuple[dict[str, Dist], dict[str, Any]]:
    """Every LangGraph figure of a run: its distributions and facts."""
    url = database_url(url)
    payload = fill.payload_of(sizes.payload_bytes)
    dists: dict[str, Dist] = {}
    peer = Peer(url, CALLERS)
    try:
        peer.clear()
        facts: dict[str, Any] = {"postgres": peer.settings(), "callers": CALLERS}
        for i in range(3):  # the graph compiles its plan and the pool warms on first use
            peer.stage(f"warm-{i}", payload)
            peer.resume(f"warm-{i}")
        with progress.phase("LangGraph on Postgres: stage (run to the interrupt)",
                            sizes.stage_single // 4) as tick:
            dists["langgraph.stage"] = _one_at_a_time(
                "langgraph stage", lambda i: peer.stage(f"stage-{i}", payload),
                sizes.stage_single // 4, tick)
        with progress.phase("LangGraph on Postgres: idle resume", sizes.idle) as tick:
            names = iter(range(sizes.idle))
            current: list[str] = [""]

            def stage_next() -> None:
                current[0] = f"idle-{next(names)}"
                peer.stage(current[0], payload)

            dists["langgraph.idle"] = measure.idle(
                "langgraph idle resume", lambda: peer.resume(current[0]), sizes.idle,
                sizes.idle_gap_s, tick, before=stage_next)
        n = max(sizes.memory_actions // 10, 200)
        with progress.phase("LangGraph on Postgres: bytes per waiting thread", n) as tick:
            peer.clear()
            before = peer.table_bytes()
            for i in range(n):
                peer.stage(f"mem-{i}", payload)
                tick(1)
            per = (peer.table_bytes() - before) / n
            facts["bytes_per_action"] = {"threads": n, "payload_bytes": sizes.payload_bytes,
                                         "per_action": per,
                                         "beyond_payload": per - sizes.payload_bytes}
        per_caller = sizes.layout_per_caller
        with progress.phase(f"LangGraph on Postgres: {CALLERS} threads resuming",
                            2 * CALLERS * per_caller) as tick:
            peer.clear()
            dists["langgraph.loaded.threads"] = _threads(peer, payload, per_caller, tick)
    finally:
        peer.clear()
        peer.close()
    with progress.phase(f"LangGraph on Postgres: {CALLERS} processes resuming", CALLERS) as tick:
        dists["langgraph.loaded.processes"] = _processes(url, per_caller, sizes.payload_bytes,
                                                         tick)
    Peer(url).clear()
    best = max(("threads", "processes"),
               key=lambda k: dists[f"langgraph.loaded.{k}"].throughput)
    facts["loaded_best"] = best
    dists["langgraph.loaded"] = dists[f"langgraph.loaded.{best}"]
    return dists, facts


def _one_at_a_time(name: str, call: Callable[[int], float], n: int, tick: Tick) -> Dist:
    dist = Dist(name)
    for i in range(n):
        dist.add_seconds(call(i))
        tick(1)
    return dist


def _threads(peer: Peer, payload: dict[str, Any], per_caller: int, tick: Tick) -> Dist:
    """Every caller's threads staged first (untimed, all callers at once), then each caller
    resumes its own back to back, all released together: as ours resolves pre-staged
    actions."""
    prefix = uuid.uuid4().hex[:8]
    names = [[f"{prefix}-{c}-{i}" for i in range(per_caller)] for c in range(CALLERS)]

    def stage_all(mine: list[str]) -> None:
        for name in mine:
            peer.stage(name, payload)
            tick(1)

    workers = [threading.Thread(target=stage_all, args=(m,)) for m in names]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    calls = [_cycle(peer, mine) for mine in names]
    return measure.loaded("langgraph loaded (threads)", calls, per_caller, tick)


def _cycle(peer: Peer, names: list[str]) -> measure.Call:
    it = iter(names)
    return lambda: peer.resume(next(it))


def _processes(url: str, per_caller: int, payload_bytes: int, tick: Tick) -> Dist:
    """``CALLERS`` processes, each with its own connection: each stages its threads, says it
    is ready, and on "go" resumes them back to back; the wall time is from the first start to
    the last end (one machine, one clock)."""
    procs = [subprocess.Popen(
        [sys.executable, "-m", "pending_actions_harness.bench.langgraph", "worker", url,
         f"p{c}-{uuid.uuid4().hex[:6]}", str(per_caller), str(payload_bytes)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for c in range(CALLERS)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"a LangGraph caller process exited {p.returncode}")
            results.append(orjson.loads(out))
            tick(1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    dist = Dist("langgraph loaded (processes)")
    for got in results:
        dist.samples_ms.extend(got["samples_ms"])
    dist.wall_s = max(g["end"] for g in results) - min(g["start"] for g in results)
    return dist


def _worker(url: str, prefix: str, n: int, payload_bytes: int) -> None:
    peer = Peer(url)
    payload = fill.payload_of(payload_bytes)
    names = [f"{prefix}-{i}" for i in range(n)]
    for name in names:
        peer.stage(name, payload)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    samples = [peer.resume(name) * 1000 for name in names]
    end = time.time()
    peer.close()
    sys.stdout.write(orjson.dumps({"samples_ms": samples, "start": start, "end": end}).decode())


if __name__ == "__main__":
    _role, url_arg, prefix_arg, n_arg, payload_arg = sys.argv[1:6]
    _worker(url_arg, prefix_arg, int(n_arg), int(payload_arg))
