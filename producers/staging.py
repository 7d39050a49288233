"""Staging, the producer's hot path: every check that needs no Redis, then one round trip
that checks handlers and tenants and reserves ids, then per ``CHUNK`` actions one MULTI/EXEC of
a stage.lua call by digest for each session's and one feed.lua call for their feed entries, the
MULTI/EXECs of a batch sent one after the other before their replies are read (``Chunks``).
``Core`` (``producers/core.py``) adds resolving and reading."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import redis

from pending_actions.broker.errors import Forbidden, InvalidInput, RedisFull, UnknownHandler
from pending_actions.broker.events import Event
from pending_actions.broker.failures import translate
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import (
    DEFAULT_TENANT,
    TOOL_RE,
    check_handler_name,
    check_session,
    check_tenant,
    spec_json,
)
from pending_actions.broker.payloads import check_json, check_payload, check_schema
from pending_actions.broker.pools import Live, parse_live, queue_live, queue_write_check
from pending_actions.broker.replies import Staged
from pending_actions.broker.scripts import Call, Queued, Scripts, Slot
from pending_actions.broker.settings import Settings
from pending_actions.producers.plans import Batch, Chunks, Plan

MAX_FINGERPRINT_CHARS = 1_000
# a part of a stage sent as one transaction: its script calls, and what queues more after them
Part = tuple[list[Call[Any]], Callable[[Any], None] | None]
FEED_FIELDS = ["event", "at", "session", "tenant", "id", "tool", "kind", "created_at"]
STAGED = Event.STAGED.value


def _incrby(pipe: Any, key: str, by: int) -> None:
    pipe.incrby(key, by)


def _incrby_all(pipe: Any, keys: Keys, sizes: dict[int, int]) -> None:
    for p, n in sizes.items():
        pipe.incrby(keys.seq(p), n)


def _foreign(session: str) -> Forbidden:
    return Forbidden(f"session {session!r} belongs to another tenant")


def _noscript(reply: object) -> bool:
    """Whether a pipeline's reply (errors left in place) says Redis lacked the script."""
    return isinstance(reply, redis.exceptions.NoScriptError)


def _by_session(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The specs of each (session, tenant), in the order given: one stage.lua call each, which
    for a batch of a few sessions is a few calls, not one per action."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in specs:
        groups.setdefault((s["session"], s["tenant"]), []).append(s)
    return list(groups.values())


class Staging:
    # ids reserved per partition in one INCRBY: a stage is then one script call, and ids stay
    # unique without a counter hit per stage (an unused rest of a block is skipped, never reused)
    ID_BLOCK = 16
    LIVE_MAX_AGE_S = 2.0  # how old the view of live workers' handlers may be at a stage
    # stage.lua calls per MULTI/EXEC: one disk sync each under appendfsync always, and Redis
    # serves no other client while it runs one (a few ms for this many)
    CHUNK = 250

    def __init__(self, settings: Settings, keys: Keys, scripts: Scripts,
                 cluster: bool = False) -> None:
        self.settings = settings
        self.keys = keys
        self.scripts = scripts
        self.cluster = cluster
        self._ids: dict[int, tuple[int, int]] = {}  # partition -> (next counter, end)
        self._lock = threading.Lock()
        self._live = Live()
        self._live_at = -1e9

    def validate(self, session: object, kind: str, tool: object, label: object, apply: object,
                 reject: object, payload: object, ttl: object = None, fingerprint: object = None,
                 schema: object = None, tenant: object = DEFAULT_TENANT) -> dict[str, Any]:
        """Every check that needs no Redis; returns the spec's fields (and ``ttl``)."""
        check_session(session)
        check_tenant(tenant)
        if not isinstance(tool, str) or not TOOL_RE.match(tool):
            raise InvalidInput("tool", f"must be 1-64 of A-Z a-z 0-9 . _ - (got {tool!r})")
        if not isinstance(label, str) or not label.strip():
            raise InvalidInput("label", "must be a non-empty string")
        if len(label) > self.settings.max_label_chars:
            raise InvalidInput("label", f"longer than {self.settings.max_label_chars} characters")
        check_handler_name("apply", apply)
        if reject is not None:
            check_handler_name("reject", reject)
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise InvalidInput("payload", f"must be a JSON object, got {type(payload).__name__}")
        check_json(payload, "payload", self.settings.max_payload_bytes)
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                                or not 0 < ttl <= 10 * 365 * 86_400):
            raise InvalidInput("ttl", f"must be a positive number of seconds (got {ttl!r})")
        if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint
                                        or len(fingerprint) > MAX_FINGERPRINT_CHARS):
            raise InvalidInput("fingerprint", f"must be a string of 1-{MAX_FINGERPRINT_CHARS} "
                               "characters")
        if schema is not None:  # before the validator walks it (recursively)
            check_json(schema, "schema", self.settings.max_payload_bytes)
        checked_schema = check_schema(schema)
        check_payload(payload, checked_schema, "payload")
        return {"session": session, "kind": kind, "tool": tool, "label": label,
                "apply": apply, "reject": reject, "payload": payload, "ttl": ttl,
                "fingerprint": fingerprint, "payload_schema": checked_schema, "tenant": tenant}

    @staticmethod
    def _spec(fields: dict[str, Any], action_id: str) -> dict[str, Any]:
        """The spec's fields (``spec_json`` stores them), ``ttl`` kept for stage.lua."""
        now = time.time()
        ttl = fields["ttl"]
        return {**fields, "id": action_id, "created_at": now,
                "expires_at": None if ttl is None else now + ttl}

    def _prepare(self, checked: list[dict[str, Any]], check_owners: bool) -> Plan[list[int]]:
        """Every handler name the validated specs use is live in some worker (the view of live
        workers may be ``LIVE_MAX_AGE_S`` old, and is read again on a miss), with
        ``check_owners`` no session belongs to another tenant, and one new seq per spec:
        ``counter * partitions + partition``, the counter that of the session's partition,
        reserved ``ID_BLOCK`` at a time for the partitions that ran out. One round trip when
        the view of live workers is fresh and has every name, so that no unknown handler can
        be refused after ids were reserved for it; none when it is and no check or id is
        needed from Redis."""
        k = self.keys
        pairs = sorted({(field, f[field]) for f in checked for field in ("apply", "reject")
                        if f[field] is not None})
        owners = sorted({(f["session"], f["tenant"]) for f in checked}) if check_owners else []
        fresh = time.monotonic() - self._live_at <= self.LIVE_MAX_AGE_S
        reread = not fresh or not all(self._live.has(n) for _f, n in pairs)
        parts = [k.partition(f["session"]) for f in checked]
        need = Counter(parts)
        got: dict[int, list[int]] = {}
        with self._lock:
            for p, n in need.items():
                nxt, end = self._ids.get(p, (0, 0))
                if end - nxt >= n:
                    got[p] = list(range(nxt, nxt + n))
                    self._ids[p] = (nxt + n, end)
        sizes = {p: max(n, self.ID_BLOCK) for p, n in need.items() if p not in got}
        # with REPLICA_WAIT a block is used only once a replica has it: a failover must not
        # roll a counter back under ids already handed out (on a cluster, where WAIT covers
        # one master, a round trip per partition)
        one_by_one = bool(self.settings.replica_wait and self.cluster)
        along = {} if reread or one_by_one else sizes

        def queue(pipe: Any) -> None:
            if reread:
                queue_live(pipe, k)
            for session, _t in owners:
                pipe.hget(k.sessions(k.partition(session)), session)
            for p, n in along.items():
                pipe.incrby(k.seq(p), n)

        replies: list[Any] = []
        if reread or owners or along:
            replies = yield Batch(queue, wait_on=k.seq(next(iter(along))) if along else None,
                                  raise_on_error=False)
        live = replies[:3] if reread else []
        tenants = replies[len(live):len(live) + len(owners)]
        ends = replies[len(live) + len(owners):]
        # a sessions hash of another type is left to stage.lua, which says so (POISON)
        failed = [r for r in (*live, *ends) if isinstance(r, Exception)] + [
            r for r in tenants if isinstance(r, Exception) and "WRONGTYPE" not in str(r)]
        if failed:
            raise translate(failed[0]) from failed[0]
        if reread:
            self._live, self._live_at = parse_live(live), time.monotonic()
        missing = next(((f, n) for f, n in pairs if not self._live.has(n)), None)
        if missing is not None:
            # workers that dropped out while Redis refused writes: say that Redis is full
            [check] = yield Batch(functools.partial(queue_write_check, keys=k),
                                  raise_on_error=False)
            if isinstance(check, Exception) and isinstance(translate(check), RedisFull):
                raise translate(check) from check
            raise UnknownHandler(*missing)
        for (session, tenant), owner in zip(owners, tenants, strict=True):
            if isinstance(owner, bytes) and owner and owner.decode() != tenant:
                raise _foreign(session)
        if sizes and not along:
            if one_by_one:
                for p, n in sizes.items():
                    ends += yield Batch(functools.partial(_incrby, key=k.seq(p), by=n),
                                        wait_on=k.seq(p))
            else:
                ends = yield Batch(functools.partial(_incrby_all, keys=k, sizes=sizes),
                                   wait_on=k.seq(next(iter(sizes))))
        with self._lock:
            for (p, size), end in zip(sizes.items(), ends, strict=True):
                first = int(end) - size + 1
                got[p] = list(range(first, first + need[p]))
                # what another thread left of an older block is skipped, never reused
                self._ids[p] = (first + need[p], int(end) + 1)
        taken = {p: iter(v) for p, v in got.items()}
        return [next(taken[p]) * k.partitions + p for p in parts]

    def stage_many(self, actions: Iterable[dict[str, Any]]) -> Plan[list[str]]:
        checked = [self.validate(a.get("session"), "action", a.get("tool"), a.get("label"),
                                 a.get("apply"), a.get("reject"), a.get("payload"),
                                 a.get("ttl"), a.get("fingerprint"), a.get("schema"),
                                 a.get("tenant", DEFAULT_TENANT))
                   for a in actions]
        if not checked:
            return []
        # stage.lua refuses a session of another tenant by itself, atomically for all of that
        # session's actions: the look ahead is needed only for a batch over several sessions,
        # none of which may be staged when one is refused
        seqs = yield from self._prepare(checked, len({f["session"] for f in checked}) > 1)
        specs = [self._spec(f, f"pending-action:{f['tool']}:{seq}")
                 for seq, f in zip(seqs, checked, strict=True)]
        staged: dict[str, Staged] = {}  # by id
        if self.settings.replica_wait and self.cluster:
            # WAIT covers one connection, so one master: with it on a cluster a batch goes a
            # session at a time, and the feed (other slots) after
            for group in _by_session(specs):
                [[got]] = yield from self._send(
                    [functools.partial(self._alone, group)], self.keys.stack(group[0]["session"]))
                staged.update(zip((s["id"] for s in group), got, strict=True))
            yield from self._send([functools.partial(self._feed_part, specs)], None)
        else:
            chunks = [specs[i:i + self.CHUNK] for i in range(0, len(specs), self.CHUNK)]
            grouped = [_by_session(chunk) for chunk in chunks]
            got_all = yield from self._send(
                [functools.partial(self._chunk, c, g)
                 for c, g in zip(chunks, grouped, strict=True)],
                self.keys.stack(specs[0]["session"]))
            for groups, got in zip(grouped, got_all, strict=True):
                for group, depths in zip(groups, got, strict=False):  # the feed's reply last
                    staged.update(zip((s["id"] for s in group), depths, strict=True))
        for spec in specs:
            if staged[spec["id"]].depth < 0:  # another tenant took the session meanwhile
                raise _foreign(spec["session"])
        return [s["id"] for s in specs]

    def _call(self, group: list[dict[str, Any]]) -> Call[list[Staged]]:
        """One stage.lua call for a session's actions. Depth 0 needs no look: an id staged
        already was staged by a retry of this; stage.lua also indexes the session and each
        ttl in its partition."""
        return self.scripts.stage(group[0]["session"], tenant=group[0]["tenant"], actions=[
            (s["id"], spec_json(s), None if s["ttl"] is None else int(s["ttl"] * 1000))
            for s in group])

    def _feed(self, specs: list[dict[str, Any]]) -> Call[int]:
        """The feed's entries for these stages, in one script call: an XADD each would double
        the commands of a stage (one more to pack, send, run and answer per action). What is
        the same in all of them (the event, the time, the kind: a batch stages actions only)
        goes once."""
        values: list[Any] = []
        for s in specs:
            values += [s["session"], s["tenant"], s["id"], s["tool"], f"{s['created_at']:.3f}"]
        return self.scripts.feed(names=FEED_FIELDS, common=[
            STAGED, f"{time.time():.3f}", "", "", "", "", specs[0]["kind"], ""], values=values)

    def _tenant_sets(self, pipe: Any, specs: list[dict[str, Any]]) -> None:
        # the default tenant has no set: its sessions are those the partitions' sessions
        # hashes give it (views.all_sessions), which saves a member (~85 B) per session
        for tenant in {s["tenant"] for s in specs} - {DEFAULT_TENANT}:
            pipe.sadd(self.keys.tenant_sessions(tenant),
                      *{s["session"] for s in specs if s["tenant"] == tenant})

    def _alone(self, group: list[dict[str, Any]]) -> Part:
        return [self._call(group)], None

    def _feed_part(self, specs: list[dict[str, Any]]) -> Part:
        return [self._feed(specs)], functools.partial(self._tenant_sets, specs=specs)

    def _chunk(self, chunk: list[dict[str, Any]], groups: list[list[dict[str, Any]]]) -> Part:
        """A chunk's stage.lua calls (one per session), its feed entries, its tenants' sets."""
        return ([*map(self._call, groups), self._feed(chunk)],
                functools.partial(self._tenant_sets, specs=chunk))

    def _send(self, parts: list[Callable[[], Part]], wait_on: str | None) -> Plan[list[list[Any]]]:
        """Each part's calls by digest, and the commands its second item queues after them, in
        a MULTI/EXEC (but on a cluster, whose slots it would span) each, built when its turn
        comes (``Chunks``);
        then, by body, those Redis lacked the script for (none ran: sending a stage again is
        safe anyway, its id stages once). Returns each part's calls' decoded replies."""
        built: dict[int, Part] = {}
        queued: dict[int, list[Queued[Any]]] = {}

        def queue(i: int, pipe: Any) -> None:
            if i not in built:
                built[i] = parts[i]()
            calls, extra = built[i]
            # queued anew when sent again (a dropped connection, REPLICA_WAIT through a failover)
            queued[i] = [c.on(pipe, by_digest=True) for c in calls]
            if extra is not None:
                extra(pipe)

        replies = yield Chunks([functools.partial(queue, i) for i in range(len(parts))], wait_on)
        failed = next((r for rs in replies for r in rs
                       if isinstance(r, Exception) and not _noscript(r)), None)
        if failed is not None:
            raise translate(failed) from failed
        missing = [(i, j) for i in range(len(parts)) for j, q in enumerate(queued[i])
                   if _noscript(replies[i][q.index])]
        again: dict[tuple[int, int], Any] = {}
        if missing:
            resent: list[Queued[Any]] = []

            def resend(pipe: Any) -> None:
                resent.clear()
                resent.extend(built[i][0][j].on(pipe) for i, j in missing)

            more = yield Batch(resend, wait_on=wait_on)
            again = {m: q.get(more) for m, q in zip(missing, resent, strict=True)}
        return [[again[(i, j)] if (i, j) in again else q.get(replies[i])
                 for j, q in enumerate(queued[i])] for i in range(len(parts))]

    def set_slot(self, session: str, slot: Slot, tool: object, label: object, apply: object,
                 reject: object) -> Plan[str]:
        fields = self.validate(session, slot, tool, label, apply, reject, None)
        seq, = yield from self._prepare([fields], True)  # set_slot.lua knows no tenant
        spec = self._spec(fields, f"{slot}:{tool}:{seq}")
        k = self.keys

        def queue(pipe: Any) -> None:
            self.scripts.set_slot(session, slot, action_id=spec["id"],
                                  spec=spec_json(spec)).on(pipe)
            # indexed for stats, views and retirement; claimed by no tenant ("") until a stage
            pipe.hsetnx(k.sessions(k.partition(session)), session, "")

        yield Batch(queue)
        return str(spec["id"])
