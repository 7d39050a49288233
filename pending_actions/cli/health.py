"""``pending-actions health``: is every loop of every live worker going round, or, with
``--worker``, is this one worker serving? (``pending-actions acl`` is in ``acl.py``.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from pending_actions.broker.errors import PendingActionsError
from pending_actions.cli.base import BadInput


def beats(pa: Any) -> tuple[int, list[dict[str, Any]]]:
    """Redis time, and every loop of every worker process with its last beat and its process's
    ``state``: ``live`` (its pulse on time), or ``stopped``: its pulse stopped (killed, hung)
    without it saying it stops, up to ``PROC_TTL_MS`` ago, and no successor runs in its place
    (one its supervisor, live, restarted: a process of the same role that names the same
    supervisor is live). A stopped process is unhealthy. One that said it stops, one stopped
    longer ago and one replaced are gone: no rows."""
    client, keys = pa.client, pa.ctx.keys
    sec, usec = client.time()
    now = int(sec) * 1000 + int(usec) // 1000
    procs = [p.decode() for p in client.zrange(keys.beat_procs, 0, -1)]
    pipe = client.pipeline(transaction=False)
    for proc in procs:
        pipe.hgetall(keys.beats(proc))
    found: dict[str, tuple[dict[str, Any], dict[str, tuple[int, int]]]] = {}
    for proc, fields in zip(procs, pipe.execute(), strict=True):
        if not fields:
            continue  # it said it stops, or its beats expired: gone
        about = orjson.loads(fields.pop(b"", b"{}"))
        found[proc] = about, {loop.decode(): (now - int(b["at"]), int(b["every"]))
                              for loop, b in ((k, orjson.loads(v)) for k, v in fields.items())}
    live = {proc for proc, (_a, ages) in found.items()
            if (pulse := ages.get("pulse")) is not None and pulse[0] <= pulse[1]}
    running = {(found[proc][0].get("supervisor"), found[proc][0].get("role")) for proc in live}
    rows = []
    for proc, (about, ages) in found.items():
        state = "live" if proc in live else "stopped"
        supervisor = about.get("supervisor")
        if state == "stopped" and supervisor in live and (supervisor, about.get("role")) in running:
            continue  # its supervisor restarted it: the successor is listed
        for loop, (age, every) in sorted(ages.items()):
            rows.append({"process": proc, "role": about.get("role"),
                         "supervisor": supervisor or None, "loop": loop,
                         "age_ms": age, "every_ms": every, "state": state,
                         "ok": state == "live" and age <= every})
    return now, rows


def worker_verdict(pa: Any, name: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Why the worker ``name`` (a `worker` process: its resolve worker's name) is not healthy,
    or None when it is; and its rows of ``beats``, its dramatiq processes' included. Healthy:
    its own loops beat on time, at least one of its dramatiq processes is live with every loop
    on time and none is stopped, and each live one's pool is live in the registry, so that
    stages of its handlers are routed to it."""
    from pending_actions.broker.routing import registered

    now, rows = beats(pa)
    own = [r for r in rows if r["process"] == name]
    procs = [r for r in rows if r["supervisor"] == name and r["role"] == "dramatiq"]
    found = own + procs
    if not own:
        return f"worker {name} is not beating (not started, stopped, or gone)", found
    if own[0]["state"] != "live":
        return f"worker {name} stopped beating (killed or hung)", found
    for r in [*own, *procs]:
        if not r["ok"]:
            what = "stopped" if r["state"] != "live" else "late"
            return (f"{r['role']} process {r['process']}: loop {r['loop']} {what} "
                    f"({r['age_ms'] / 1000:.1f}s ago, every {r['every_ms'] / 1000:g}s)"), found
    live = {r["process"] for r in procs}  # all ok, so all live
    if not live:
        return f"worker {name}: no dramatiq process beating yet (handlers loading?)", found
    missing = sorted(live - registered(pa.client, pa.ctx.keys, now))
    if missing:
        return (f"worker {name}: handlers not registered by dramatiq process "
                f"{', '.join(missing)}"), found
    return None, found


def worker_name(given: str) -> str | None:
    """NAME, or from ``@PATH`` the name a worker wrote there (``worker --id-file``): None while
    there is no such file (the worker has not started, or stopped cleanly)."""
    if not given.startswith("@"):
        return given
    path = Path(given[1:])
    if not given[1:]:
        raise BadInput("--worker @PATH needs a path")
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadInput(f"cannot read the worker id file {path}: {exc.strerror}") from None
    if not text:
        raise BadInput(f"the worker id file {path} holds no name")
    return text


@click.command()
@click.option("--worker", "worker", metavar="NAME|@PATH",
              help="Check only this worker (a container's healthcheck): NAME, or @PATH, the "
                   "file `worker --id-file PATH` writes its name to.")
@click.pass_obj
def health(obj: Any, worker: str | None) -> None:
    """Exit 0 when every loop of every live worker has beaten within its interval; 1 when
    one has not, when a worker process stopped beating without saying it stops (killed or
    hung, within the last minute, and not restarted by its supervisor), or when no worker is
    alive. Lists each loop's last beat.

    With --worker, only that worker: 0 when its loops beat on time, its dramatiq processes
    too, and their handlers are registered; else 1 and one line saying why."""
    from pending_actions.broker.failures import redis_errors

    name = None if worker is None else worker_name(worker)
    if worker is not None and name is None:
        obj.out({"healthy": False, "worker": None, "why": "no id file yet", "loops": []},
                f"unhealthy: no worker id file {worker[1:]} yet (the worker has not started)")
        sys.exit(1)
    try:
        pa = obj.client()
        with redis_errors():
            if name is not None:
                why, rows = worker_verdict(pa, name)
            else:
                _now, rows = beats(pa)
    except PendingActionsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if name is not None:
        obj.out({"healthy": why is None, "worker": name, "why": why, "loops": rows},
                f"unhealthy: {why}" if why else
                f"worker {name} healthy: {len(rows)} loops on time, handlers registered")
        sys.exit(0 if why is None else 1)
    healthy = bool(rows) and all(r["ok"] for r in rows)
    verdict = {"live": "LATE", "stopped": "STOPPED"}
    lines = [f"{r['process']}  {r['loop']:<14} {r['age_ms'] / 1000:7.1f}s ago "
             f"(every {r['every_ms'] / 1000:g}s)  {'ok' if r['ok'] else verdict[r['state']]}"
             for r in rows]
    obj.out({"healthy": healthy, "loops": rows},
            "\n".join(lines) if rows else "no live worker")
    sys.exit(0 if healthy else 1)
