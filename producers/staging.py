"""Staging, the producer's hot path: every check that needs no Redis, then one round trip
that checks handlers and tenants and reserves ids (reserve.lua), then per ``CHUNK`` actions one
MULTI/EXEC of a stage.lua call by digest for each session's (which also writes their feed
entries and claims a new session for its tenant, in the same step), the MULTI/EXECs of a batch
sent one after the other before their replies are read (``Chunks``). A stage refused writes
nothing but the id blocks it reserved. ``Core`` (``producers/core.py``) adds resolving and
reading."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from pending_actions.broker import texts, tracing
from pending_actions.broker.atomic.replies import Staged, StageRefusal
from pending_actions.broker.atomic.scripts import Call, Scripts, Slot
from pending_actions.broker.errors import (
    Damaged,
    Denied,
    ForeignSession,
    InvalidInput,
    PendingActionsError,
    Poison,
    RedisFull,
    UnknownHandler,
    Unowned,
)
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
from pending_actions.broker.policy.rules import Verdict
from pending_actions.broker.routing import Live, parse_live, queue_live, queue_write_check
from pending_actions.broker.settings import Settings
from pending_actions.producers.plans import Batch, Plan, send_scripts
from pending_actions.producers.policy_versions import PolicyPlans, raise_denied

MAX_FINGERPRINT_CHARS = 1_000


def _foreign(session: str) -> ForeignSession:
    return ForeignSession(f"session {session!r} belongs to another tenant")


def _unowned(session: str, record: str) -> Unowned:
    return Unowned(f"session {session!r} has keys but no owner record (no field in {record}): "
                   "nothing was staged; an operator restores the record with `pending-actions "
                   f"repair --session {session}`")


# the replies the owner check reads per session: its owner record, a TYPE for each of the
# three keys of _session_types, then its stack's depth and its in-flight count
_LOOKED = 6


def _session_types(k: Keys, session: str) -> tuple[tuple[str, str], ...]:
    """A session's own keys and their types, as stage.lua checks them."""
    return ((k.stack(session), "zset"), (k.actions(session), "hash"),
            (k.history(session), "stream"))


def _by_session(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The specs of each (session, tenant), in the order given: one stage.lua call each, which
    for a batch of a few sessions is a few calls, not one per action."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in specs:
        groups.setdefault((s["session"], s["tenant"]), []).append(s)
    return list(groups.values())


class Staging(PolicyPlans):
    # tries of a session's stage decided by a version of its tenant's policy that changed
    # meanwhile (stage.lua refuses it, the client reads the new version and decides again)
    POLICY_TRIES = 3
    # ids reserved per partition a block at a time (reserve.lua): a stage is then one script
    # call, and ids stay unique without a counter hit per stage (an unused rest of a block is
    # skipped, never reused). A block used up within ID_BLOCK_GROW_S of its reservation is
    # followed by one twice its size, up to ID_BLOCK_MAX: a busy producer then pays the two
    # round trips of a reservation (the owners' check, reserve.lua) once in hundreds of
    # stages, not once in 16, and an occasional one keeps its ids close together
    ID_BLOCK = 16
    ID_BLOCK_MAX = 1024
    ID_BLOCK_GROW_S = 10.0
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
        # partition -> (the size of its last block, when it was reserved: monotonic s)
        self._blocks: dict[int, tuple[int, float]] = {}
        # partition -> a counter value known to be taken (an id stage.lua found holding
        # another action): the next block there starts past it
        self._floor: dict[int, int] = {}
        self._lock = threading.Lock()
        self._live = Live()
        self._live_at = -1e9
        PolicyPlans.__init__(self)

    def validate(self, session: object, kind: str, tool: object, label: object, apply: object,
                 reject: object, payload: object, ttl: object = None, fingerprint: object = None,
                 schema: object = None, tenant: object = DEFAULT_TENANT,
                 people: object = None) -> dict[str, Any]:
        """Every check that needs no Redis; returns the spec's fields (and ``ttl``).
        ``people``: the agent runtime asks people for it whatever the policy allows (a
        framework tool's own approval flag, pending_actions/adapters): the name shown as the
        rule of its ``ask``."""
        check_session(session)
        check_tenant(tenant)
        if people is not None:
            check_handler_name("people", people)
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
                "fingerprint": fingerprint, "payload_schema": checked_schema, "tenant": tenant,
                "people": people}

    @staticmethod
    def _spec(fields: dict[str, Any], action_id: str, trace: str | None) -> dict[str, Any]:
        """The spec's fields (``spec_json`` stores them), ``ttl`` kept for stage.lua; ``trace``:
        the context it is staged in (``tracing.carried()``), kept with it."""
        now = time.time()
        ttl = fields["ttl"]
        return {**fields, "id": action_id, "created_at": now,
                "expires_at": None if ttl is None else now + ttl, "trace": trace,
                "verdict": None, "policy": None}

    def _prepare(self, checked: list[dict[str, Any]], check_owners: bool) -> Plan[list[int]]:
        """Every handler name the validated specs use is live in some worker (the view of live
        workers may be ``LIVE_MAX_AGE_S`` old, and is read again on a miss), with
        ``check_owners`` every session is the tenant's or nobody's yet (and if nobody's, has no
        keys: its record was not lost), and one new seq per spec: ``counter * partitions +
        partition``, the counter that of the session's partition, reserved ``ID_BLOCK`` at a
        time (reserve.lua) for the partitions that ran out, once the handlers and the sessions'
        owners are checked: a refused stage reserves nothing. None when the view is fresh and
        no check or id is needed from Redis; one for the checks; one more for a block."""
        k = self.keys
        pairs = sorted({(field, f[field]) for f in checked for field in ("apply", "reject")
                        if f[field] is not None})
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
            floors = {p: self._floor.get(p, 0) for p in need}
            sizes = {p: max(n, self._block_size(p)) for p, n in need.items() if p not in got}
        # a stage that stage.lua would refuse writes nothing, not even an id block: before a
        # block is reserved (when a partition's block runs out), every session is checked
        # first, the block reserved in a round trip after
        owners = sorted({(f["session"], f["tenant"]) for f in checked}) \
            if check_owners or sizes else []
        # with REPLICA_WAIT a block is used only once a replica has it: a failover must not
        # roll a counter back under ids already handed out (on a cluster, where WAIT covers
        # one master, a round trip per partition)
        one_by_one = bool(self.settings.replica_wait and self.cluster)

        def queue(pipe: Any) -> None:
            if reread:
                queue_live(pipe, k)
            for session, _t in owners:
                pipe.hget(k.sessions(k.partition(session)), session)
                for key, _want in _session_types(k, session):
                    pipe.type(key)
                pipe.zcard(k.stack(session))
                pipe.hlen(k.inflight(session))

        replies: list[Any] = []
        if reread or owners:
            replies = yield Batch(queue, raise_on_error=False)
        live = replies[:3] if reread else []
        looked = replies[len(live):len(live) + _LOOKED * len(owners)]
        ends: list[Any] = []
        # a sessions hash of another type is left to stage.lua, which says so (POISON)
        failed = [r for r in live if isinstance(r, Exception)] + [
            r for r in looked if isinstance(r, Exception) and "WRONGTYPE" not in str(r)]
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
        # a handler the workers keep to some tenants (an MCP upstream set up for one) is not
        # staged for another: refused before anything is written, as a missing one is
        kept = next(((f["tenant"], name) for f in checked for name in (f["apply"], f["reject"])
                     if name is not None and not self._live.admits(name, f["tenant"])), None)
        if kept is not None:
            tenant, name = kept
            raise Denied(texts.handler_kept(name, tenant), None,
                         by="the workers' tenants of that handler")
        staging = Counter(f["session"] for f in checked)
        for i, (session, tenant) in enumerate(owners):
            owner, *kinds, stacked, flying = looked[_LOOKED * i:_LOOKED * (i + 1)]
            if isinstance(owner, bytes) and owner and owner.decode() != tenant:
                raise _foreign(session)
            # stage.lua's order: a key of another type is POISON before a lost owner record
            found = [kind.decode() if isinstance(kind, bytes) else str(kind) for kind in kinds]
            for (key, want), kind in zip(_session_types(k, session), found, strict=True):
                if kind not in ("none", want):
                    raise Poison("type", key, kind)
            if owner is None and any(kind != "none" for kind in found):
                raise _unowned(session, k.sessions(k.partition(session)))
            # stage.lua's limit, looked at ahead for a batch over several sessions, none of
            # which may be staged when one is refused (counting every action as one it
            # pushes: a denied one, which pushes none, is decided only later)
            if isinstance(stacked, int) and isinstance(flying, int) and \
                    stacked + flying + staging[session] > self.settings.max_pending_per_session:
                raise self._full(session, stacked + flying, staging[session])
        if sizes:
            if one_by_one:
                for p, n in sizes.items():
                    ends += yield Batch(functools.partial(self._reserve, p=p, size=n,
                                                          floor=floors[p]), wait_on=k.seq(p))
            else:
                ends = yield Batch(functools.partial(self._reserve_all, sizes=sizes,
                                                     floors=floors),
                                   wait_on=k.seq(next(iter(sizes))))
        for p, end in zip(sizes, ends, strict=True):
            if int(end) < 0:
                raise Damaged(f"the id counter {k.seq(p)} and its copy {k.seq_mark(p)} are "
                              "both gone (deleted by hand?): no id of that partition is known "
                              "to be free, so nothing was staged; `pending-actions repair "
                              "--ids` sets them past every id in use")
        with self._lock:
            now = time.monotonic()
            for (p, size), end in zip(sizes.items(), ends, strict=True):
                self._blocks[p] = (size, now)
                first = int(end) - size + 1
                got[p] = list(range(first, first + need[p]))
                # what another thread left of an older block is skipped, never reused
                self._ids[p] = (first + need[p], int(end) + 1)
        taken = {p: iter(v) for p, v in got.items()}
        return [next(taken[p]) * k.partitions + p for p in parts]

    def _block_size(self, p: int) -> int:
        """(Under ``_lock``) the size of partition ``p``'s next id block."""
        size, at = self._blocks.get(p, (0, -1e9))
        if time.monotonic() - at > self.ID_BLOCK_GROW_S:
            return self.ID_BLOCK
        return min(2 * size, self.ID_BLOCK_MAX)

    def admits(self, name: str, tenant: str) -> Plan[bool]:
        """Whether the live workers serve handler ``name`` to ``tenant`` (one kept to some
        tenants does not serve another), as a stage sees them (the view at most
        ``LIVE_MAX_AGE_S`` old): for a caller that runs what the handler stands for itself
        (``mcp-proxy`` forwards an allowed call to its upstream)."""
        check_tenant(tenant)
        if time.monotonic() - self._live_at > self.LIVE_MAX_AGE_S:
            replies = yield Batch(lambda pipe: queue_live(pipe, self.keys))
            self._live, self._live_at = parse_live(replies), time.monotonic()
        return self._live.admits(name, tenant)

    def _reserve(self, pipe: Any, p: int, size: int, floor: int) -> None:
        self.scripts.reserve(p, size=size, floor=floor).on(pipe)

    def _reserve_all(self, pipe: Any, sizes: dict[int, int], floors: dict[int, int]) -> None:
        for p, n in sizes.items():
            self._reserve(pipe, p, n, floors[p])

    def stage_many(self, actions: Iterable[dict[str, Any]]) -> Plan[list[str]]:
        checked = [self.validate(a.get("session"), "action", a.get("tool"), a.get("label"),
                                 a.get("apply"), a.get("reject"), a.get("payload"),
                                 a.get("ttl"), a.get("fingerprint"), a.get("schema"),
                                 a.get("tenant", DEFAULT_TENANT), a.get("people"))
                   for a in actions]
        if not checked:
            return []
        # stage.lua refuses a session of another tenant (or one whose owner record was lost)
        # by itself, atomically for all of that session's actions: the look ahead is needed
        # only for a batch over several sessions, none of which may be staged when one is
        # refused
        seqs = yield from self._prepare(checked, len({f["session"] for f in checked}) > 1)
        trace = tracing.carried()  # the stage span's, when its caller traces
        specs = [self._spec(f, f"pending-action:{f['tool']}:{seq}", trace)
                 for seq, f in zip(seqs, checked, strict=True)]
        tracing.staged(specs)
        answers = yield from self._stage_specs(specs)
        for _try in range(self.POLICY_TRIES - 1):
            # decided by a version of the policy the partition no longer has (or before this
            # client saw the tenant's): nothing of that session changed; decided again
            again = [(g, a) for g, a in answers if a.refused is StageRefusal.POLICY]
            if not again:
                break
            for group, got in again:
                yield from self.load_policy(group[0]["tenant"], got.version)
            answers = [(g, a) for g, a in answers if a.refused is not StageRefusal.POLICY]
            answers += yield from self._stage_specs([s for g, _a in again for s in g])
        refused = [(group, got) for group, got in answers if got.refused is not None]
        if refused:
            self._refused(*refused[0], others=len({g[0]["session"] for g, a in answers
                                                  if a.refused is None}))
        raise_denied(specs)
        return [s["id"] for s in specs]

    def _stage_specs(self, specs: list[dict[str, Any]]
                     ) -> Plan[list[tuple[list[dict[str, Any]], Staged]]]:
        """Every spec decided by its tenant's policy as this client knows it and sent: each
        session's stage.lua call and its answer."""
        answers: list[tuple[list[dict[str, Any]], Staged]] = []
        if self.settings.replica_wait and self.cluster:
            # WAIT covers one connection, so one master: with it on a cluster a batch goes a
            # session at a time
            for group in _by_session(specs):
                [[got]] = yield from send_scripts(
                    [functools.partial(self._calls, [group])],
                    self.keys.stack(group[0]["session"]))
                answers.append((group, got))
        else:
            chunks = [specs[i:i + self.CHUNK] for i in range(0, len(specs), self.CHUNK)]
            grouped = [_by_session(chunk) for chunk in chunks]
            got_all = yield from send_scripts(
                [functools.partial(self._calls, g) for g in grouped],
                self.keys.stack(specs[0]["session"]))
            for groups, got in zip(grouped, got_all, strict=True):
                answers += zip(groups, got, strict=True)
        return answers

    def _refused(self, group: list[dict[str, Any]], got: Staged, others: int) -> None:
        """Raise what stage.lua's refusal of a session's actions means (nothing of that
        session changed). A collision: that id held another action, so the partition's counter
        was set back (a failover without REPLICA_WAIT, or by hand); this client's block there
        is dropped and its next one starts past the id."""
        session, k = group[0]["session"], self.keys
        if got.refused is StageRefusal.FOREIGN:
            raise _foreign(session)
        if got.refused is StageRefusal.UNOWNED:
            raise _unowned(session, k.sessions(k.partition(session)))
        if got.refused is StageRefusal.FULL:
            raise self._full(session, int(got.collided), len(group))
        if got.refused is StageRefusal.POLICY:
            raise PendingActionsError(
                f"the policy of tenant {group[0]['tenant']!r} changed {self.POLICY_TRIES} times "
                f"while this stage was decided; nothing was staged in session {session!r}: "
                "stage again")
        p = k.partition(session)
        value = int(got.collided.rpartition(":")[2]) // k.partitions
        with self._lock:
            self._ids.pop(p, None)
            self._floor[p] = max(self._floor.get(p, 0), value)
        also = f"; the actions of {others} other session(s) of this batch were staged" \
            if others else ""
        raise Damaged(f"id {got.collided} already holds another action in session {session!r}: "
                      f"the id counter {k.seq(p)} was set back; nothing was staged in that "
                      f"session{also}. Its next ids start past that one: stage again")

    def _full(self, session: str, depth: int, adding: int) -> InvalidInput:
        limit = self.settings.max_pending_per_session
        return InvalidInput("session", f"session {session!r} holds {depth} pending action(s), "
                            f"and {adding} more would take it past {limit} "
                            "(MAX_PENDING_PER_SESSION): nothing was staged; resolve or discard "
                            "some first")

    def _call(self, group: list[dict[str, Any]]) -> Call[Staged]:
        """One stage.lua call for a session's actions, each decided by its tenant's policy as
        this client knows it (the spec keeps the decision), which also writes their feed
        entries and, for a new session, its owner record and tenant index."""
        tenant = group[0]["tenant"]
        version = self.policy_version(tenant)
        policy = self.policy_of(tenant, version)
        if version and policy is None:  # another thread's load cleared the cache: read again
            raise PendingActionsError(f"the policy of tenant {tenant!r} is not at hand; "
                                      "nothing was staged: stage again")
        staged = []
        for s in group:
            verdict = None if policy is None else policy.decide(
                tool=s["tool"], apply=s["apply"], label=s["label"], session=s["session"],
                payload=s["payload"], reject=s["reject"])
            if s["people"] and (verdict is None or verdict.decision == "allow"):
                # at least one person's approval, whatever the policy allows; a policy's deny
                # or ask of more people stands
                verdict = Verdict("ask", s["people"], approvals=1,
                                  version=0 if verdict is None else verdict.version)
            s["verdict"] = verdict
            s["policy"] = None if verdict is None else verdict.stamp()
            staged.append(self.to_stage(s, verdict))
        tracing.policy_decided([s["verdict"] for s in group])
        return self.scripts.stage(
            group[0]["session"], tenant=tenant, indexed=tenant != DEFAULT_TENANT,
            at=f"{time.time():.3f}", actions=staged, policy_version=version,
            marker_ttl_s=self.settings.reply_ttl_s + self.settings.dispatch_timeout_ms // 1000
            + 60)

    def _calls(self, groups: list[list[dict[str, Any]]]) -> list[Call[Staged]]:
        """A transaction's stage.lua calls, one per session."""
        return [self._call(g) for g in groups]

    def set_slot(self, session: str, slot: Slot, tool: object, label: object, apply: object,
                 reject: object) -> Plan[str]:
        fields = self.validate(session, slot, tool, label, apply, reject, None)
        # the model's resolve applies a slot, so only what the (default) tenant's policy lets
        # the model apply may be set: a denied or people's (ask) decision refuses it, nothing
        # set (decided by the version in force as it is set: a slot has no version check)
        verdict = yield from self.decide(session=session, tool=fields["tool"],
                                         apply=fields["apply"], label=fields["label"],
                                         payload={}, reject=fields["reject"])
        if verdict is not None and verdict.decision != "allow":
            raise Denied(verdict.reason if verdict.decision == "deny"
                         else texts.slot_needs_people(slot, verdict.approvals), verdict.rule)
        seq, = yield from self._prepare([fields], True)  # set_slot.lua knows no tenant
        spec = self._spec(fields, f"{slot}:{tool}:{seq}", tracing.carried())
        k = self.keys

        def queue(pipe: Any) -> None:
            self.scripts.set_slot(session, slot, action_id=spec["id"],
                                  spec=spec_json(spec)).on(pipe)
            # indexed for stats, views and retirement, and the default tenant's (slots are its
            # alone): another tenant's stage must never take over a session that holds one
            pipe.hsetnx(k.sessions(k.partition(session)), session, DEFAULT_TENANT)

        yield Batch(queue)
        return str(spec["id"])
