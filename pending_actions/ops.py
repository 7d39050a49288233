"""Operator views in the terminal: the ``stats`` table and ``top``, a live view of the same
figures refreshed in place (Ctrl-C quits)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click
import orjson

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
        ["staged (all time)", d["staged_total"]], ["malformed requests",
                                                    d["malformed_requests"]],
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
    entries: Any = pa.client.xrevrange(pa.ctx.keys.events, count=count)
    lines = []
    for entry_id, raw in entries:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        at = time.strftime("%H:%M:%S", time.localtime(int(entry_id.split(b"-")[0]) / 1000))
        by = f" by {fields['by']}" if fields.get("by") else ""
        lines.append(f"{at}  {fields.get('event', '?'):<13} {fields.get('session', '')}  "
                     f"{fields.get('id', '')}{by}")
    return lines


def frame(pa: PendingActions,
          previous: tuple[float, int, int] | None) -> tuple[str, Any, Figures]:
    """One screen of ``top`` and what the next frame needs to compute rates."""
    f = figures(pa)
    outcomes: Any = pa.client.xlen(pa.ctx.keys.events)
    rates = None
    if previous is not None:
        dt = max(f.at - previous[0], 1e-6)
        rates = {"staged": (f.staged_total - previous[1]) / dt,
                 "events": (int(outcomes) - previous[2]) / dt}
    head = time.strftime("%H:%M:%S", time.localtime(f.at))
    text = "\n\n".join([f"pending-actions top  {head}  (Ctrl-C quits)",
                        stats_text(f, rates), "recent events (newest first)",
                        "\n".join(_recent(pa, 10)) or "(none)"])
    return text, (f.at, f.staged_total, int(outcomes)), f


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
