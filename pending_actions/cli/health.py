"""``pending-actions health``: is every loop of every live worker going round? (``pending-actions
acl`` is in ``acl.py``.)"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from pending_actions.broker.errors import PendingActionsError


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
            rows.append({"process": proc, "role": about.get("role"), "loop": loop,
                         "age_ms": age, "every_ms": every, "state": state,
                         "ok": state == "live" and age <= every})
    return now, rows


@click.command()
@click.pass_obj
def health(obj: Any) -> None:
    """Exit 0 when every loop of every live worker has beaten within its interval; 1 when
    one has not, when a worker process stopped beating without saying it stops (killed or
    hung, within the last minute, and not restarted by its supervisor), or when no worker is
    alive. Lists each loop's last beat."""
    from pending_actions.broker.failures import redis_errors

    try:
        pa = obj.client()
        with redis_errors():
            _now, rows = beats(pa)
    except PendingActionsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    healthy = bool(rows) and all(r["ok"] for r in rows)
    verdict = {"live": "LATE", "stopped": "STOPPED"}
    lines = [f"{r['process']}  {r['loop']:<14} {r['age_ms'] / 1000:7.1f}s ago "
             f"(every {r['every_ms'] / 1000:g}s)  {'ok' if r['ok'] else verdict[r['state']]}"
             for r in rows]
    obj.out({"healthy": healthy, "loops": rows},
            "\n".join(lines) if rows else "no live worker")
    sys.exit(0 if healthy else 1)
