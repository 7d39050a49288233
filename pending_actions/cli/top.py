"""Operator views in the terminal: the ``stats`` table and ``top``, a live view of the same
figures refreshed in place (Ctrl-C quits)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click
import orjson

from pending_actions.broker.feed import Feeds, order
from pending_actions.producers import PendingActions
from pending_actions.views import Figures, figures


def age(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join
    out = [line(h.ljust(w) for h, w in zip(header, widths, strict=True)),
           line("-" * w for w in widths)]
    out += [line(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(x.rstrip() for x in out)


def stats_text(f: Figures, rates: dict[str, float] | None = None) -> str:
    d = f.as_dict()
    totals = [
        ["sessions", d["sessions"]], ["pending", d["pending"]], ["in flight", d["in_flight"]],
        ["dead letters", d["dead"]], ["requests waiting", d["requests_waiting"]],
        ["tasks queued", d["tasks_queued"]],
        ["leases", f"{d['leases']} ({d['leases_overdue']} overdue)"],
        # ids go out in blocks per producer process: a bound on the ids, not a count of stages
        ["ids reserved (all time)", d["ids_reserved"]],
        ["malformed requests", d["malformed_requests"]],
        ["handlers", ", ".join(d["handlers"]) or "(none registered)"],
    ]
    if rates is not None:
        totals += [[f"{name}/s", f"{value:.1f}"] for name, value in rates.items()]
    parts = [table([[str(a), str(b)] for a, b in totals], ["figure", "value"])]
    tenants = d["tenants"]
    if tenants:
        parts.append(table([[t, str(v["pending"]), str(v["in_flight"]), str(v["dead"]),
                             age(v["oldest_age_s"]) if v["pending"] else "-"]
                            for t, v in tenants.items()],
                           ["tenant", "pending", "in flight", "dead", "oldest"]))
        by_tool = [[t, tool, str(n)] for t, v in tenants.items() for tool, n in
                   v["by_tool"].items()]
        if by_tool:
            parts.append(table(by_tool, ["tenant", "tool", "pending"]))
    return "\n\n".join(parts)


def _recent(pa: PendingActions, count: int) -> list[str]:
    # the newest of all are among the newest of each partition
    found = [e for each in Feeds(pa.client, pa.ctx.keys).latest(count) for e in each]
    found.sort(key=lambda e: order(e[1]), reverse=True)
    lines = []
    for _p, entry_id, fields in found[:count]:
        at = time.strftime("%H:%M:%S", time.localtime(order(entry_id)[0] / 1000))
        by = f" by {fields['by']}" if fields.get("by") else ""
        lines.append(f"{at}  {fields.get('event', '?'):<13} {fields.get('session', '')}  "
                     f"{fields.get('id', '')}{by}")
    return lines


FEED_SAMPLE = 5_000  # the newest feed entries a frame reads, at most, to count its rates


def feed_rates(pa: PendingActions, since_ms: int, now_ms: int) -> dict[str, float]:
    """Stages and events per second from the event feed's entries since ``since_ms`` (Redis
    time, as the entries' ids are). Each partition's newest share of ``FEED_SAMPLE`` is read;
    past a full share the rate is that of the time every partition's share covers: a sample,
    never a walk over the whole capped feed."""
    share = max(1, FEED_SAMPLE // pa.ctx.keys.partitions)
    each = Feeds(pa.client, pa.ctx.keys).latest(share, since_ms)
    since_ms = max([since_ms] + [order(got[-1][1])[0] for got in each if len(got) == share])
    entries = [e for got in each for e in got if order(e[1])[0] >= since_ms]
    seconds = max(now_ms - since_ms, 1) / 1000
    staged = sum(1 for _p, _id, fields in entries if fields.get("event") == "staged")
    return {"staged": staged / seconds, "events": len(entries) / seconds}


def frame(pa: PendingActions, previous: int | None) -> tuple[str, int, Figures]:
    """One screen of ``top`` and what the next frame needs to compute rates (Redis's time)."""
    f = figures(pa)
    now: Any = pa.client.time()
    if isinstance(now, dict):  # a cluster client asks every node: any one's clock will do
        now = next(iter(now.values()))
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    rates = None if previous is None else feed_rates(pa, previous, now_ms)
    head = time.strftime("%H:%M:%S", time.localtime(f.at))
    text = "\n\n".join([f"pending-actions top  {head}  (Ctrl-C quits)",
                        stats_text(f, rates), "recent events (newest first)",
                        "\n".join(_recent(pa, 10)) or "(none)"])
    return text, now_ms, f


@click.command()
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--iterations", type=click.IntRange(min=1), help="Stop after N frames.")
@click.pass_obj
def top(obj: Any, interval: float, iterations: int | None) -> None:
    """A live view of the queue: pending by tenant and tool, oldest age, in flight, dead,
    leases, rates and the latest events, refreshed in place."""
    pa = obj.client()
    previous = None
    n = 0
    # on a terminal each frame redraws the screen (cursor home + clear); piped, frames follow
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        while iterations is None or n < iterations:
            text, previous, data = frame(pa, previous)
            if obj.as_json:
                click.echo(orjson.dumps(data.as_dict()).decode())
            else:
                click.echo(clear + text, color=True)
            n += 1
            if iterations is None or n < iterations:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
