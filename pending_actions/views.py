"""Views across sessions, for people and operators: the inbox of a tenant, every pending or
dead action, and the deployment's figures (``stats``, ``top``, ``/metrics``).

Sessions are found with HSCAN / SSCAN over the session indexes (never KEYS), and read in
pipelined batches, so a view costs a few round trips per few hundred sessions and never blocks
Redis. A session is shown as a tenant's only when its owner record (its field in its
partition's sessions hash) says so: an index entry is a hint, never a grant. A session with
keys but no record is shown to nobody but the operator's all-tenant views that ask for it
(``--unowned``), marked so.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal

import orjson

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import (
    DEFAULT_TENANT,
    NAME_RE,
    PendingAction,
    ResolveAction,
    Spec,
    person,
    tool_of,
)
from pending_actions.producers import PendingActions

BATCH = 200
NO_TENANT = "-"  # sessions claimed by no tenant yet (only a slot was set)
UNOWNED = "(unowned)"  # sessions with keys but no owner record: an operator's to mend
Suffix = Literal["actions", "dead", "history"]  # what a session without a record is found by


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def scan(pa: PendingActions, key: str) -> Iterator[str]:
    for member in pa.client.sscan_iter(key, count=BATCH):
        yield _text(member)


def owned_sessions(pa: PendingActions) -> Iterator[tuple[str, str]]:
    """Every session with an owner record, and its tenant (``NO_TENANT`` for none yet), from
    the partitions' sessions hashes."""
    k = pa.ctx.keys
    for p in range(k.partitions):
        for session, tenant in pa.client.hscan_iter(k.sessions(p), count=BATCH):
            yield _text(session), _text(tenant) or NO_TENANT


def tenant_sessions(pa: PendingActions, tenant: str) -> Iterator[str]:
    """The sessions whose owner record (their field in their partition's sessions hash) names
    ``tenant``, and only those: for the default tenant, from the sessions hashes; for another,
    from its index in each partition, each member kept only when its record names the tenant,
    so an index entry that strayed there shows nothing."""
    if tenant == DEFAULT_TENANT:
        yield from (session for session, owner in owned_sessions(pa) if owner == tenant)
        return
    k = pa.ctx.keys
    for p in range(k.partitions):
        for chunk in _batches(scan(pa, k.tenant_index(p, tenant))):
            owners: Any = pa.client.hmget(k.sessions(p), chunk)
            yield from (session for session, owner in zip(chunk, owners, strict=True)
                        if owner is not None and _text(owner) == tenant)


def unowned_sessions(pa: PendingActions, *suffixes: Suffix) -> Iterator[str]:
    """Sessions with a key of one of ``suffixes`` (``actions``: something pending; ``dead``:
    dead letters; ``history``: anything staged) but no owner record (deleted by hand: stage
    refuses them, ``repair`` restores it). Found by a SCAN of the whole key space (never
    KEYS): for the operator's all-tenant views and ``repair`` only."""
    k = pa.ctx.keys
    pattern = k.session_pattern(suffixes[0] if len(suffixes) == 1 else "")
    found: dict[int, set[str]] = defaultdict(set)
    for key in pa.client.scan_iter(match=pattern, count=1000):
        session = _session_of(k, _text(key), suffixes)
        if session is not None:
            found[k.partition(session)].add(session)
    for p, sessions in found.items():
        for chunk in _batches(sorted(sessions)):
            owners: Any = pa.client.hmget(k.sessions(p), chunk)
            yield from (s for s, owner in zip(chunk, owners, strict=True) if owner is None)


def _session_of(k: Keys, key: str, suffixes: tuple[Suffix, ...]) -> str | None:
    """The session whose key of one of ``suffixes`` ``key`` is, or None (another key, or one
    that only looks like it)."""
    session = k.session_of(key, suffixes)
    return session if session is not None and NAME_RE.match(session) else None


def listed(pa: PendingActions, tenant: str | None, suffix: Suffix,
           unowned: bool = False) -> Iterator[tuple[str, str]]:
    """The sessions a view lists, each with its owner: a tenant's (checked against their owner
    records); without a tenant, every session with a record, and with ``unowned`` then those
    with a key ``suffix`` but no record, as ``UNOWNED`` (a SCAN: an operator's user's)."""
    if tenant:
        yield from ((session, tenant) for session in tenant_sessions(pa, tenant))
        return
    yield from owned_sessions(pa)
    if unowned:
        yield from ((session, UNOWNED) for session in unowned_sessions(pa, suffix))


def all_sessions(pa: PendingActions, tenant: str | None = None) -> Iterator[str]:
    """Every session with an owner record, or a tenant's (``tenant_sessions``)."""
    if tenant:
        return tenant_sessions(pa, tenant)
    return (session for session, _owner in owned_sessions(pa))


def _batches(items: Iterable[str]) -> Iterator[list[str]]:
    it = iter(items)
    while chunk := list(islice(it, BATCH)):
        yield chunk


def inbox(pa: PendingActions, tenant: str, viewer: str | None = None) -> list[dict[str, Any]]:
    """The tenant's pending actions, newest first. ``target`` marks the one a resolve of its
    session would take now (its stack's head), which is the only one a person can act on;
    ``approval`` what people's approvals stand at, as ``viewer`` (a person's name) sees it."""
    now = time.time()
    try:  # as every approval compares it; a name that is no person's has approved nothing
        me = person("viewer", viewer) if viewer is not None else None
    except InvalidInput:
        me = None
    out: list[dict[str, Any]] = []
    for session in tenant_sessions(pa, tenant):
        head_seen = False
        for a in pa.pending(session):
            target = a.state == "pending" and not head_seen
            head_seen = head_seen or a.state == "pending"
            out.append({**a.model_dump(), "age_s": round(now - a.created_at, 3),
                        "target": target, "approval": approval(a, me)})
    out.sort(key=lambda a: a["created_at"], reverse=True)
    return out


def approval(a: PendingAction, me: str | None) -> dict[str, Any] | None:
    """Where people's approvals of an ``ask`` action stand, per verb, for the person ``me``
    (None for an action no person needs to approve): ``{"needed": N, "apply": {"by": [...],
    "missing": k, "mine": bool}, "discard": {...} or None}``. Approvals count for one verb at a
    time, so the verb they are not of has none; a discard runs through approvals only when it
    runs a reject handler (``None``: a person's discard goes through at once). ``approved_by``
    comes from ``pending``, which leaves out approvals through revoked tokens: what counts."""
    policy = a.policy or {}
    if policy.get("decision") != "ask":
        return None
    needed = int(policy.get("approvals") or 1)

    def of(verb: ResolveAction) -> dict[str, Any]:
        names = a.approved_by if a.approving == verb else []
        return {"by": names, "missing": max(0, needed - len(names)), "mine": me in names}

    return {"needed": needed, "apply": of("apply"),
            "discard": of("discard") if a.reject else None}


def dead_all(pa: PendingActions, tenant: str | None = None,
             unowned: bool = False) -> list[dict[str, Any]]:
    """Every dead letter of a tenant's sessions, or of every session (with ``unowned``, those
    of sessions with no owner record too, marked so)."""
    k = pa.ctx.keys
    out: list[dict[str, Any]] = []
    for chunk in _pairs(listed(pa, tenant, "dead", unowned)):
        pipe = pa.client.pipeline(transaction=False)
        for session, _owner in chunk:
            pipe.lrange(k.dead(session), 0, -1)
        for (session, owner), items in zip(chunk, pipe.execute(), strict=True):
            mark = {"unowned": True} if owner == UNOWNED else {}
            out.extend({"session": session, **orjson.loads(raw), **mark} for raw in items)
    return out


def _pairs(items: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    it = iter(items)
    while chunk := list(islice(it, BATCH)):
        yield chunk


@dataclass
class Figures:
    """What an operator watches; every count is read at one moment, session batch by batch."""

    at: float = field(default_factory=time.time)
    sessions: int = 0
    pending: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tenant, tool)
    in_flight: Counter[str] = field(default_factory=Counter)  # tenant
    dead: Counter[str] = field(default_factory=Counter)  # tenant
    oldest: dict[str, float] = field(default_factory=dict)  # tenant -> created_at
    requests_waiting: int = 0
    tasks_queued: int = 0
    leases: int = 0
    leases_overdue: int = 0
    # counter values handed out, in blocks per producer process: an id's upper bound, never
    # a count of stages (a block's unused values are skipped)
    ids_reserved: int = 0
    malformed_requests: int = 0
    handlers: list[str] = field(default_factory=list)

    def oldest_age(self, tenant: str) -> float:
        return max(0.0, self.at - self.oldest[tenant]) if tenant in self.oldest else 0.0

    def as_dict(self) -> dict[str, Any]:
        tenants = sorted({t for t, _ in self.pending} | set(self.in_flight) | set(self.dead))
        return {
            "sessions": self.sessions, "requests_waiting": self.requests_waiting,
            "tasks_queued": self.tasks_queued, "leases": self.leases,
            "leases_overdue": self.leases_overdue, "ids_reserved": self.ids_reserved,
            "malformed_requests": self.malformed_requests, "handlers": self.handlers,
            "pending": sum(self.pending.values()), "in_flight": sum(self.in_flight.values()),
            "dead": sum(self.dead.values()),
            "tenants": {t: {"pending": sum(n for (tt, _), n in self.pending.items() if tt == t),
                            "in_flight": self.in_flight[t], "dead": self.dead[t],
                            "oldest_age_s": round(self.oldest_age(t), 3),
                            "by_tool": {tool: n for (tt, tool), n in sorted(self.pending.items())
                                        if tt == t}}
                        for t in tenants},
        }


def figures(pa: PendingActions) -> Figures:
    k, c = pa.ctx.keys, pa.client
    f = Figures()
    owned = owned_sessions(pa)
    while chunk := list(islice(owned, BATCH)):
        pipe = c.pipeline(transaction=False)
        for session, _t in chunk:
            pipe.zrange(k.stack(session), 0, -1)
            pipe.hvals(k.inflight(session))
            pipe.llen(k.dead(session))
        got = pipe.execute()
        tails: list[tuple[str, str, str]] = []
        for i, (session, tenant) in enumerate(chunk):
            stack, leases, dead = got[3 * i:3 * i + 3]
            f.sessions += 1
            for raw in stack:
                f.pending[(tenant, tool_of(raw.decode()))] += 1
            # a substring test (cjson writes no spaces): an unreadable lease must not stop
            # the figures
            f.in_flight[tenant] += sum(1 for raw in leases if b'"kind":"action"' in raw)
            f.dead[tenant] += dead
            if stack:  # the stack keeps staging order (re-adds return to where they came
                tails.append((session, tenant, stack[-1].decode()))  # from): the tail is oldest
        if tails:
            pipe = c.pipeline(transaction=False)
            for session, _t, action_id in tails:
                pipe.hget(k.actions(session), action_id)
            for (session, tenant, action_id), raw in zip(tails, pipe.execute(), strict=True):
                if raw is not None:
                    created = Spec.read(raw, action_id, session).created_at
                    f.oldest[tenant] = min(f.oldest.get(tenant, created), created)
    base = pa.stats()
    f.requests_waiting = base["requests_waiting"]
    f.tasks_queued = base["tasks_queued"]
    f.leases = base["leases"]
    f.ids_reserved = base["ids_reserved"]
    f.malformed_requests = base["malformed_requests"]
    f.handlers = base["handlers"]
    pipe = c.pipeline(transaction=False)
    for p in range(k.partitions):
        pipe.zcount(k.leases(p), "-inf", f.at * 1000)
    f.leases_overdue = sum(int(n) for n in pipe.execute())
    return f
