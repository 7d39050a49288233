"""``pending-actions health``: is every loop of every live worker going round? (``pending-actions
acl`` is in ``acl.py``.)"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from pending_actions.broker.errors import PendingActionsError


def beats(pa: Any) -> tuple[int, list[dict[str, Any]]]:
    """Redis time, and every loop of every live worker process with its last beat."""
    client, keys = pa.client, pa.ctx.keys
    sec, usec = client.time()
    now = int(sec) * 1000 + int(usec) // 1000
    procs = [p.decode() for p in client.zrange(keys.beat_procs, 0, -1)]
    pipe = client.pipeline(transaction=False)
    for proc in procs:
        pipe.hgetall(keys.beats(proc))
    rows = []
    for proc, fields in zip(procs, pipe.execute(), strict=True):
        if not fields:
            continue  # its pulse stopped: the process is gone
        about = orjson.loads(fields.pop(b"", b"{}"))
        ages = {loop.decode(): (now - int(b["at"]), int(b["every"]))
                for loop, b in ((k, orjson.loads(v)) for k, v in fields.items())}
        pulse = ages.get("pulse")
        if pulse is None or pulse[0] > pulse[1]:
            continue  # its pulse stopped: the process is gone (or going), not a dead loop
        for loop, (age, every) in sorted(ages.items()):
            rows.append({"process": proc, "role": about.get("role"), "loop": loop,
                         "age_ms": age, "every_ms": every, "ok": age <= every})
    return now, rows


@click.command()
@click.pass_obj
def health(obj: Any) -> None:
    """Exit 0 when every loop of every live worker has beaten within its interval; 1 when
    one has not, or when no worker is alive. Lists each loop's last beat."""
    from pending_actions.broker.failures import redis_errors

    try:
        pa = obj.client()
        with redis_errors():
            _now, rows = beats(pa)
    except PendingActionsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    healthy = bool(rows) and all(r["ok"] for r in rows)
    lines = [f"{r['process']}  {r['loop']:<14} {r['age_ms'] / 1000:7.1f}s ago "
             f"(every {r['every_ms'] / 1000:g}s)  {'ok' if r['ok'] else 'LATE'}" for r in rows]
    obj.out({"healthy": healthy, "loops": rows},
            "\n".join(lines) if rows else "no live worker")
    sys.exit(0 if healthy else 1)
