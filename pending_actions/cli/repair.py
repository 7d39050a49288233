"""``pending-actions repair``: mend what was deleted or set back outside the service, which the
service refuses to guess at rather than hand a session to the wrong tenant or an id out twice.

* A session's owner record (its field in its partition's sessions hash). Without it every stage
  into the session is refused (``Unowned``) and no tenant's view shows it. It is restored from
  what the session's own keys say, which only stage.lua wrote, each under the owner check: its
  specs (a spec names its tenant, but the default one) and its history's staged entries (each
  names a tenant other than the default; an older version's name none). When they say nothing
  (only dead letters left, say) the operator names the tenant (``--tenant``); when they name
  another one, or several, the session is left as it is.
* A partition's id counter and its mark, both lost (``--ids``): stage refuses to hand out an
  id there (``Damaged``). They are set past every id the partition's keys still hold, with a
  margin for the blocks producers reserved before and still hand out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import click
import orjson

from pending_actions.broker.errors import PendingActionsError
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import DEFAULT_TENANT, check_session, check_tenant
from pending_actions.cli.base import Obj, fail
from pending_actions.producers import PendingActions

# counter values left free past the highest id found: producers hand out what is left of the
# blocks they reserved before the counter was lost (16 values a block, more for a batch)
MARGIN = 1_000_000


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def evidence(pa: PendingActions, session: str) -> set[str]:
    """The tenants the session's specs and staged history entries name."""
    k = pa.ctx.keys
    said: set[str] = set()
    specs: Any = pa.client.hvals(k.actions(session))
    for raw in specs:
        try:
            spec = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # an unreadable spec says nothing (the worker that meets it parks it)
        if isinstance(spec, dict):
            said.add(str(spec.get("tenant") or DEFAULT_TENANT))
    entries: Any = pa.client.xrange(k.history(session))
    said |= {_text(f[b"tenant"]) for _e, f in entries
             if f.get(b"event") == b"staged" and b"tenant" in f}
    return said


Outcome = Literal["restored", "fine", "left"]  # "left": it needs the operator's word


def restore_owner(pa: PendingActions, session: str,
                  tenant: str | None = None) -> tuple[Outcome, str]:
    """Restore the session's owner record if it has keys but none: what became of it, and
    that in words."""
    check_session(session)
    if tenant is not None:
        check_tenant(tenant)
    k = pa.ctx.keys
    p = k.partition(session)
    owner: Any = pa.client.hget(k.sessions(p), session)
    if owner is not None:
        return "fine", f"has its owner record ({_text(owner) or 'no tenant yet'})"
    if not pa.client.exists(k.stack(session), k.actions(session), k.history(session),
                            k.dead(session)):
        return "fine", "has no keys: nothing to restore"
    said = evidence(pa, session)
    if len(said) > 1 or (said and tenant is not None and said != {tenant}):
        return "left", (f"its keys name {', '.join(sorted(said))}"
                        f"{'' if tenant is None else f', not {tenant}'}: left as it is")
    found = next(iter(said), tenant)
    if found is None:
        return "left", "its keys name no tenant: left as it is (name it with --tenant)"
    pipe = pa.client.pipeline(transaction=False)
    pipe.hsetnx(k.sessions(p), session, found)
    if found != DEFAULT_TENANT:
        pipe.sadd(k.tenant_index(p, found), session)
    if not pipe.execute()[0]:
        return "fine", "was given an owner record meanwhile"
    return "restored", f"owner record restored: {found}"


def _value(raw: Any) -> int | None:
    """A counter's value, or None when absent or not a whole number (as reserve.lua reads)."""
    text = _text(raw) if raw is not None else ""
    return int(text) if text.isdigit() else None


def highest(pa: PendingActions, partition: int) -> int:
    """The highest counter value of an id the partition's keys hold (0 for none): its feed,
    its expiries, and each of its sessions' specs, history and dead letters."""
    k = pa.ctx.keys
    client: Any = pa.client
    ids: list[str] = [_text(f.get(b"id", b"")) for _e, f in client.xrange(k.events(partition))]
    ids += [_text(m).rpartition("/")[2] for m in client.zrange(k.expiries(partition), 0, -1)]
    sessions = {_text(s) for s in client.hkeys(k.sessions(partition))}
    for key in client.scan_iter(match=k.session_pattern(partition=partition), count=1000):
        session = k.session_of(key, ("actions", "history", "dead"))  # unrecorded ones too
        if session is not None:
            sessions.add(session)
    for session in sessions:
        if not session or k.partition(session) != partition:
            continue
        ids += [_text(x) for x in client.hkeys(k.actions(session))]
        ids += [_text(f.get(b"id", b"")) for _e, f in client.xrange(k.history(session))]
        for raw in client.lrange(k.dead(session), 0, -1):
            try:
                ids.append(str(orjson.loads(raw).get("id", "")))
            except (orjson.JSONDecodeError, AttributeError):
                continue
    return max([0, *_values(k, partition, ids)])


def _values(k: Keys, partition: int, ids: Iterable[str]) -> Iterable[int]:
    for action_id in ids:
        seq = action_id.rpartition(":")[2]
        if seq.isdigit() and int(seq) % k.partitions == partition:
            yield int(seq) // k.partitions


def rebuild_ids(pa: PendingActions) -> list[tuple[int, int]]:
    """Set every partition's lost counter and mark (both gone, the partition used) past the
    highest id it holds; returns each (partition, value) set."""
    k, client = pa.ctx.keys, pa.client
    done = []
    for p in range(k.partitions):
        if _value(client.get(k.seq(p))) is not None or _value(client.get(k.seq_mark(p))) \
                is not None:
            continue  # reserve.lua rebuilds the other from it
        if not client.exists(k.sessions(p)) and not client.xlen(k.events(p)):
            continue  # never used: it starts at 0
        value = highest(pa, p) + MARGIN
        client.set(k.seq(p), value)
        client.set(k.seq_mark(p), value)
        done.append((p, value))
    return done


@click.command()
@click.option("--session", "sessions", multiple=True, metavar="SESSION",
              help="Restore this session's owner record (repeatable) [default: every session "
                   "with keys and none, found by SCAN].")
@click.option("--tenant", help="The owner of a session whose keys name no tenant.")
@click.option("--ids", is_flag=True, help="Rebuild the id counters of the partitions that "
              "lost both their counter and its copy, instead.")
@click.pass_obj
def repair(obj: Obj, sessions: tuple[str, ...], tenant: str | None, ids: bool) -> None:
    """Mend what was deleted by hand: sessions' owner records (from what the sessions' own keys
    say), or with --ids the partitions' id counters. Exits 1 when something is left as it
    is."""
    from pending_actions.views import unowned_sessions

    try:
        pa = obj.client()
        if ids:
            done = rebuild_ids(pa)
            obj.out([{"partition": p, "counter": v} for p, v in done],
                    "\n".join(f"partition {p}: {pa.ctx.keys.seq(p)} set to {v}"
                              for p, v in done) or "no id counter is lost")
            return
        found = list(sessions) or sorted(unowned_sessions(pa, "history", "actions", "dead"))
        results = [(s, *restore_owner(pa, s, tenant)) for s in found]
    except PendingActionsError as exc:
        fail(exc)
    obj.out([{"session": s, "outcome": outcome, "note": note} for s, outcome, note in results],
            "\n".join(f"{s}: {note}" for s, _o, note in results)
            or "every session with keys has its owner record")
    if any(outcome == "left" for _s, outcome, _n in results):
        raise SystemExit(1)
