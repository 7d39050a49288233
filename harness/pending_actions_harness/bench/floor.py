"""The floor of a durable resolve: the chain of processes an idle resolve of ours crosses, with
the same hops and the same durable writes, and no work in it.

The caller writes its request and waits for the answer in one round trip (XADD, then BLPOP of
its reply key, pipelined: write 1). A resolve worker process blocked on the request stream
wakes and takes it in one script (the request acked, a task added to the task stream: write 2).
A worker process's consumer thread blocked on the task stream wakes and hands the task to one
of its worker threads through a queue, which finishes it in one script (the task acked, the
reply pushed: write 3) and the caller wakes. Redis and the client library (redis-py) are ours;
the scripts are a line each; no model, no JSON, no lease, no check. Under ``appendfsync always``
each of the three writes waits for its fsync, as the three a resolve of ours cannot do without
(the request, the take, the outcome) do.

``python -m pending_actions_harness.bench.floor resolver|worker URL [THREADS]`` runs one of
the two processes; ``run`` starts both and measures idle round trips as ours are measured
(the same pauses; ``appendfsync always``, everysec, no AOF), on a database of its own."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from pending_actions.procs import ROOT, Child, await_ready, child_env
from pending_actions_harness.bench import measure
from pending_actions_harness.bench.measure import Call
from pending_actions_harness.bench.progress import Progress

DB = 8  # of the run's private redis-server
PHASES = 4  # progress phases of ``run``: the start, then always, everysec and no AOF

REQUESTS, TASKS, GROUP, READY = "floor:requests", "floor:tasks", "floor", "floor:ready"
# write 2: the request acked, its task added (ours: take.lua)
TAKE = """redis.call('XACK', KEYS[1], 'floor', ARGV[1])
return redis.call('XADD', KEYS[2], '*', 'reply', ARGV[2])"""
# write 3: the task acked, the answer pushed (ours: finalize.lua)
FINISH = """redis.call('XACK', KEYS[1], 'floor', ARGV[1])
return redis.call('RPUSH', KEYS[2], 'applied')"""


def _entries(reply: Any) -> list[tuple[bytes, bytes]]:
    """(entry id, reply key) of each entry of an XREADGROUP reply of one stream."""
    return [(entry_id, fields[b"reply"]) for _stream, entries in reply or []
            for entry_id, fields in entries]


def resolver(url: str) -> None:
    client = redis.Redis.from_url(url)
    take = client.register_script(TAKE)
    client.rpush(READY, f"resolver {os.getpid()}")
    while True:
        got = client.xreadgroup(GROUP, "resolver", {REQUESTS: ">"}, count=16, block=0)
        for entry_id, reply in _entries(got):
            take(keys=[REQUESTS, TASKS], args=[entry_id, reply])


def worker(url: str, threads: int) -> None:
    client = redis.Redis.from_url(url)
    finish = client.register_script(FINISH)
    work: queue.Queue[tuple[bytes, bytes]] = queue.Queue()

    def run() -> None:
        while True:
            entry_id, reply = work.get()
            finish(keys=[TASKS, reply], args=[entry_id])

    for _ in range(threads):
        threading.Thread(target=run, daemon=True).start()
    client.rpush(READY, f"worker {os.getpid()}")
    while True:  # the consumer thread: one blocking read, its tasks to the worker threads
        for one in _entries(client.xreadgroup(GROUP, "worker", {TASKS: ">"}, count=threads,
                                              block=0)):
            work.put(one)


def start(url: str, threads: int, log_dir: Path, timeout: float = 60.0) -> list[Child]:
    """Both processes on the (flushed) database of ``url``, once each has said it is ready."""
    client = redis.Redis.from_url(url)
    try:
        client.delete(REQUESTS, TASKS, READY)
        for stream in (REQUESTS, TASKS):
            client.xgroup_create(stream, GROUP, id="$", mkstream=True)
        children: list[Child] = []
        try:
            for role, extra in (("resolver", []), ("worker", [str(threads)])):
                child = Child(f"floor-{role}", [
                    sys.executable, "-m", "pending_actions_harness.bench.floor", role, url,
                    *extra], env=child_env(), cwd=ROOT,
                    log_path=log_dir / f"floor-{role}.log").spawn()
                children.append(child)
                await_ready(child, lambda s: client.blpop([READY], timeout=max(1, round(s)))
                            is not None, timeout)
        except BaseException:
            for child in children:
                child.kill()
            raise
        return children
    finally:
        client.close()


def caller(client: redis.Redis) -> Call:
    """One timed round trip: the request written and its answer awaited in one pipeline."""
    pipe = client.pipeline(transaction=False)

    def call() -> float:
        reply = f"floor:reply:{uuid.uuid4().hex}"
        started = time.perf_counter()
        pipe.xadd(REQUESTS, {"reply": reply})
        pipe.blpop([reply], timeout=30)
        _id, answer = pipe.execute()
        elapsed = time.perf_counter() - started
        if answer is None:
            raise TimeoutError("no answer from the floor's chain within 30 s")
        return elapsed

    return call


def run(r: Any, base: str, logs: Path, progress: Progress) -> None:
    """``floor.idle``, ``floor.idle.everysec`` and ``floor.idle.noaof`` into ``r.dists``, with
    a worker of ``r.options.threads`` threads, as ours has."""
    s = r.sizes
    url = f"{base}/{DB}"
    with progress.phase("floor: start its resolve worker and worker process", 1) as tick:
        children = start(url, r.options.threads, logs)
        tick(1)
    client = redis.Redis.from_url(url)
    try:
        call = caller(client)
        r.dists["floor.idle"], r.dists["floor.idle.everysec"] = measure.idle_resolves(
            client, "floor", None, call, s.idle, s.idle_gap_s, progress)
        r.dists["floor.idle.noaof"] = measure.idle_without_aof(
            client, "floor", None, call, s.idle, s.idle_gap_s, progress)
        for child in children:
            child.check_alive()
    finally:
        for child in children:
            child.kill()
        client.flushdb()
        client.close()


if __name__ == "__main__":
    if sys.argv[1] == "resolver":
        resolver(sys.argv[2])
    else:
        worker(sys.argv[2], int(sys.argv[3]))
