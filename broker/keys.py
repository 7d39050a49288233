"""Every Redis key name, in one place.

Sessions are spread over ``partitions`` partitions (a stable hash of the session id). Each
partition has one hash tag, and every key of its sessions and of the partition itself (request
stream, lease index, id counter, sessions hash, task streams) carries that tag: one Redis Cluster
slot per partition, so a script can touch a session and its partition's lease index and task
stream in one atomic step. A session's key names still contain its id
(``pa:{p3-41}:s:<session>:stack``), so they stay readable with redis-cli.

The tags are chosen so that partition slots are evenly spaced over 0..16383: ``redis-cli
--cluster create`` gives each master an equal run of slots, so the partitions, and the load,
spread evenly over any number of masters. Changing ``partitions`` on a live deployment moves
every session to other keys: drain first (no pending action, no request in flight).

Global keys (pool registry, worker lifecycle stream) are read rarely, never on the resolve
path."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

RESOLVER_GROUP = "resolvers"
TASK_GROUP = "workers"
# the mark of an expiry index with no entry (``Keys.expiries_due``): a ms beyond any expiry,
# kept exact by a Lua number (a double) and by a Python int alike
NOTHING_DUE = 2**53 - 1


@cache
def partition_tags(partitions: int) -> tuple[str, ...]:
    """One hash tag per partition, the i-th landing in the middle half of the i-th of
    ``partitions`` equal slot ranges."""
    width = REDIS_CLUSTER_HASH_SLOTS / partitions
    tags = []
    for i in range(partitions):
        low, high = int(i * width + width / 4), int(i * width + 3 * width / 4)
        n = 0
        while not low <= key_slot(f"p{i}-{n}".encode()) < max(high, low + 1):
            n += 1
        tags.append(f"p{i}-{n}")
    return tuple(tags)


@dataclass(frozen=True)
class Keys:
    prefix: str = "pa"
    partitions: int = 16
    tags: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # session -> the start of its key names: a stage names five keys, a batch of them the same
    # few sessions' over and over (bounded: cleared when full)
    _heads: dict[str, str] = field(default_factory=dict, init=False, repr=False,
                                   compare=False)

    RESOLVER_GROUP = RESOLVER_GROUP
    TASK_GROUP = TASK_GROUP

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", partition_tags(self.partitions))

    def partition(self, session: str) -> int:
        """The session's partition: stable across processes and restarts (crc32, not hash())."""
        return zlib.crc32(session.encode()) % self.partitions

    def _p(self, partition: int, name: str) -> str:
        return f"{self.prefix}:{{{self.tags[partition]}}}:{name}"

    # --- per session: the slot of its partition --------------------------------------------
    def _s(self, session: str, name: str) -> str:
        head = self._heads.get(session)
        if head is None:
            if len(self._heads) >= 100_000:
                self._heads.clear()
            head = self._heads[session] = self._p(self.partition(session), f"s:{session}:")
        return head + name

    def stack(self, session: str) -> str:
        """ZSET of pending action ids, the head (newest) the lowest score: a one-member zset
        is a listpack, smaller than a one-item list (see docs/design.md)."""
        return self._s(session, "stack")

    def actions(self, session: str) -> str:
        """HASH id -> spec JSON (immutable once staged) for actions, directive and standing."""
        return self._s(session, "actions")

    def state(self, session: str) -> str:
        """HASH id -> {"attempts","stalls","last_error"} JSON: the mutable part."""
        return self._s(session, "state")

    def directive(self, session: str) -> str:
        """STRING: id of the directive, if one is set."""
        return self._s(session, "directive")

    def standing(self, session: str) -> str:
        """STRING: id of the standing handler, if one is set."""
        return self._s(session, "standing")

    def inflight(self, session: str) -> str:
        """HASH lease token -> lease JSON for every attempt that is running or dispatched."""
        return self._s(session, "inflight")

    def history(self, session: str) -> str:
        """STREAM of every stage, take, outcome and recovery of the session."""
        return self._s(session, "history")

    def dead(self, session: str) -> str:
        """LIST of dead-lettered actions with the reason."""
        return self._s(session, "dead")

    def expired(self, session: str) -> str:
        """ZSET of the session's actions that ended as expired, score when, trimmed to the last
        ``expired_memory_s``: lets a late ``resolve(expect_id=)`` be told why."""
        return self._s(session, "expired")

    def run(self, session: str) -> str:
        """HASH: the session's agent-framework run (pending_actions/adapters): its tenant, the
        framework's serialized state and the calls it waits for while paused, the lease of the
        one process continuing it, and ``out:<action id>`` -> the result text a worker applied.
        Expires ``run_ttl_s`` after its last write: a paused run nobody resumes goes."""
        return self._s(session, "run")

    def denial(self, session: str, action_id: str) -> str:
        """STRING with a TTL (``reply_ttl_s``): the spec of an action a policy denied, written by
        the stage.lua call that recorded the denial, so that the same call sent again (a lost
        reply) records nothing twice."""
        return self._s(session, f"denied:{action_id}")

    def request_marker(self, session: str, request_id: str) -> str:
        """STRING with a TTL: a resolve request already taken (dedupes redelivered requests)."""
        return self._s(session, f"req:{request_id}")

    def reply(self, session: str, request_id: str) -> str:
        """LIST with a TTL: where the resolver waits (BLPOP) for its result."""
        return self._s(session, f"reply:{request_id}")

    # --- per partition ----------------------------------------------------------------------
    def seq(self, partition: int) -> str:
        """Counter behind the ids staged in this partition: ``seq = counter * partitions +
        partition``, so ids are unique across partitions without one global counter. Written
        only by reserve.lua, with its mark."""
        return self._p(partition, "seq")

    def seq_mark(self, partition: int) -> str:
        """STRING: the counter's copy, written in the same step (reserve.lua): a counter
        deleted or set back is rebuilt from it before any id is handed out, so an id is never
        handed out twice."""
        return self._p(partition, "seq:mark")

    def requests(self, partition: int) -> str:
        """STREAM of resolve requests of this partition's sessions (consumer group
        ``resolvers``)."""
        return self._p(partition, "requests")

    def requests_dead(self, partition: int) -> str:
        """STREAM of malformed entries taken off the request stream, with the reason."""
        return self.stream_dead(self.requests(partition))

    def leases(self, partition: int) -> str:
        """ZSET of every live lease of the partition, member ``<session>/<token>`` (see
        ``lease_member``), score its deadline in ms: kept in step by the scripts that make,
        renew and end leases; tells recovery where to look."""
        return self._p(partition, "leases")

    def expiries(self, partition: int) -> str:
        """ZSET of the partition's actions staged with a ttl, member ``<session>/<id>`` (see
        ``expiry_member``), score its expiry in ms (server clock): the only record of a ttl.
        Every reader treats an action past its score as gone, before the sweep ends it; the
        recovery loop finds there what to end."""
        return self._p(partition, "expiries")

    def expiries_due(self, partition: int) -> str:
        """STRING, ms: no entry of the partition's ``expiries`` is due before it (a lower bound of
        its lowest score; ``NOTHING_DUE`` when it has none). ``stage.lua`` lowers it, the sweep
        sets it from the index (``mark_expiries.lua``), so an idle sweep reads these marks, one
        command, rather than every index. Absent or unreadable: not known, the index is read."""
        return self._p(partition, "expiries:due")

    def sessions(self, partition: int) -> str:
        """HASH session -> tenant of every session of the partition that staged something or
        set a slot and is not retired yet: its tenant claim (written by its first stage, never
        changed; "" while only a slot was set) and the index that stats, views and retirement
        scan. One field per session, not a key of its own: a key costs a session ~100 B more.
        The one owner record: every view checks a session against it."""
        return self._p(partition, "sessions")

    def tenant_index(self, partition: int, tenant: str) -> str:
        """SET of the partition's sessions claimed by ``tenant`` (what a tenant's views scan;
        the default tenant has none, its sessions are those the sessions hash gives it).
        stage.lua adds a session in the step that claims it, retire.lua removes it in the step
        that drops its owner record. Only a hint: a view shows a member only when the
        session's field in ``sessions`` names the tenant."""
        return self._p(partition, f"tenant:{tenant}")

    def events(self, partition: int) -> str:
        """STREAM of every stage and outcome of the partition's sessions, capped
        (``broker/feed.py``): what webhooks, metrics and ``top`` read, every partition's. In
        the partition's slot, so stage.lua writes a stage's entries itself (only for what it
        staged) and an outcome's entry rides in the round trip of the script that made it. A
        session's own history stays the record; this is a feed."""
        return self._p(partition, "events")

    def policy_markers(self, partition: int) -> str:
        """HASH tenant -> the version of its policy this partition's stages are checked against
        (stage.lua refuses a stage decided by another): raised by ``pa.set_policy`` after it
        writes the version (mark_policy.lua, never lowered), and by housekeeping when a set
        stopped half way. No field: the tenant has no policy here."""
        return self._p(partition, "policies")

    def revoked(self, partition: int) -> str:
        """SET of the grant ids (``serve/auth.py``, ``Principal.grant``) of serve tokens that
        were revoked: an approval given through one no longer counts (take.lua, pending.lua).
        One per partition, so that a script reads it in its own slot; written in every
        partition by ``token revoke`` and never trimmed (a revocation is rare, its id 16
        characters)."""
        return self._p(partition, "revoked")

    def task_queue(self, partition: int, pool: str) -> str:
        """STREAM of handler tasks of this partition for the workers of ``pool``."""
        return self._p(partition, f"dq:{pool}")

    def task_dead(self, partition: int, pool: str) -> str:
        """STREAM of task messages that were nacked or could not be decoded."""
        return self.stream_dead(self.task_queue(partition, pool))

    def plain_queue(self, queue: str) -> str:
        """STREAM backing a dramatiq queue on a Redis of its own (``DRAMATIQ_URL``), where no
        script enqueues and partitions do not matter."""
        return f"{self.prefix}:dq:{queue}"

    @staticmethod
    def stream_dead(stream: str) -> str:
        """STREAM where the entries of ``stream`` (a request or task stream, either of the above,
        or a ``plain_queue``) that cannot be served are parked, with the reason; in its slot."""
        return f"{stream}:dead"

    def session_pattern(self, suffix: str = "", partition: int | None = None) -> str:
        """The SCAN pattern of every session's keys ending in ``:suffix`` (any of a session's
        keys without one), of every partition or of one: found without an index, for the
        sweep, the operator's views of sessions with no owner record, and repair."""
        tag = "*" if partition is None else self.tags[partition]
        return f"{self.prefix}:{{{tag}}}:s:*" + (f":{suffix}" if suffix else "")

    def session_of(self, key: bytes | str, suffixes: Iterable[str]) -> str | None:
        """The session whose key of one of ``suffixes`` (``inflight``, ``actions``, ...)
        ``key`` is; None for a key of another form, or one that only looks like it."""
        name = key.decode() if isinstance(key, bytes) else key
        head, sep, rest = name.partition("}:s:")
        session, _, suffix = rest.rpartition(":")
        if not sep or not head.startswith(f"{self.prefix}:{{") or suffix not in suffixes \
                or not session:
            return None
        return session if self._s(session, suffix) == name else None

    def inflight_pattern(self) -> str:
        """The SCAN pattern every session's ``inflight`` hash matches (workers/sweep.py): no
        index of them is needed, nor trusted."""
        return self.session_pattern("inflight")

    def session_of_inflight(self, key: bytes | str) -> str | None:
        """The session whose ``inflight`` hash ``key`` is; None for a key of another form."""
        return self.session_of(key, ("inflight",))

    def policy_markers_pattern(self) -> str:
        """Every partition's ``policy_markers`` (an ACL key pattern)."""
        return f"{self.prefix}:{{*}}:policies"

    def revoked_pattern(self) -> str:
        """Every partition's ``revoked`` (an ACL key pattern)."""
        return f"{self.prefix}:{{*}}:revoked"

    @staticmethod
    def pool_member(pool: str, instance: str) -> str:
        """A worker process of ``pool`` in ``pool_live``."""
        return f"{pool}/{instance}"

    @staticmethod
    def lease_member(session: str, token: str) -> str:
        # "/" never occurs in a session id, so the member splits back unambiguously
        return f"{session}/{token}"

    @staticmethod
    def expiry_member(session: str, action_id: str) -> str:
        """An action's member in its partition's ``expiries``, as the scripts write it."""
        return f"{session}/{action_id}"

    @staticmethod
    def parse_lease_member(member: bytes | str) -> tuple[str, str]:
        text = member.decode() if isinstance(member, bytes) else member
        session, _, token = text.rpartition("/")
        return session, token

    # --- global (one tag, so the registry can be read in one pipeline on a cluster) ---------
    @property
    def pools(self) -> str:
        """HASH pool id -> JSON list of the handler names of the workers of that pool."""
        return f"{self.prefix}:{{registry}}:pools"

    @property
    def pool_live(self) -> str:
        """ZSET ``<pool>/<instance>`` -> expiry in ms: a worker process of the pool that is
        alive (heartbeat) until then; removed at clean shutdown."""
        return f"{self.prefix}:{{registry}}:live"

    @property
    def workers(self) -> str:
        """STREAM of worker lifecycle events (ready, stopping)."""
        return f"{self.prefix}:workers"

    # --- auth: a prefix of its own, ``<prefix>-auth``, which the ``<prefix>:*`` key pattern of
    # the producer and worker Redis users does not match (``pending-actions acl``): only serve
    # and the user that runs ``pending-actions token`` reach it. KEY_PREFIX never ends in
    # "-auth", so one deployment's auth keys are never another's ordinary ones
    @property
    def auth_prefix(self) -> str:
        return f"{self.prefix}-auth"

    @property
    def tokens(self) -> str:
        """HASH sha256(token) -> JSON {name, tenant, role, created_at}: never the token itself."""
        return f"{self.auth_prefix}:{{tokens}}:by-hash"

    @property
    def token_names(self) -> str:
        """HASH token name -> sha256(token), for revocation by name."""
        return f"{self.auth_prefix}:{{tokens}}:by-name"

    @property
    def first_token(self) -> str:
        """HASH ``made`` -> the name of the admin token ``serve --first-token`` created, once
        per deployment: never deleted, so a restart after that token's revocation makes none."""
        return f"{self.auth_prefix}:{{tokens}}:first"

    # --- policies: a prefix of their own, ``<prefix>-policy``, which the producer and worker
    # Redis users may only read (docs/threat-model.md); one slot, ``{policies}``
    @property
    def policy_prefix(self) -> str:
        return f"{self.prefix}-policy"

    def policy(self, tenant: str) -> str:
        """HASH of every version of a tenant's policy: ``version`` -> the last number, ``<N>`` ->
        version N's record JSON {version, set_at, by, document}, ``current`` -> the newest
        record (one HGET reads it). Written by set_policy.lua only."""
        return f"{self.policy_prefix}:{{policies}}:t:{tenant}"

    @property
    def policy_index(self) -> str:
        """HASH tenant -> its current policy version, written with the version (set_policy.lua):
        what housekeeping raises the partitions' markers to."""
        return f"{self.policy_prefix}:{{policies}}:index"

    @property
    def webhooks_dead(self) -> str:
        """STREAM of webhook deliveries given up after their retries, with the last error."""
        return f"{self.prefix}:webhooks:dead"

    # --- liveness of worker loops (broker/loops.py): one slot, read by ``health`` ----------
    @property
    def beat_procs(self) -> str:
        """ZSET process name -> its last beat (Redis time, ms)."""
        return f"{self.prefix}:{{beats}}:procs"

    def beats(self, proc: str) -> str:
        """HASH loop name -> {"at","every"} JSON, and "" -> the process's host/pid/role; it
        expires unless the process's pulse renews it."""
        return f"{self.prefix}:{{beats}}:proc:{proc}"

    @property
    def housekeeping(self) -> str:
        """HASH: where the pass over each sessions hash stands (workers/retention.py): its
        key -> "<began, Redis ms> <its size then> <scan cursor> <sessions looked at> <done:
        0|1>". Lost or garbled: that pass starts again."""
        return f"{self.prefix}:housekeeping"

    @property
    def sweep(self) -> str:
        """HASH: where the slow sweep of in-flight state stands (workers/sweep.py): "node" ->
        the index of the Redis it scans (a cluster's masters by name; 0 on one), "cursor" ->
        its SCAN cursor there, "page" -> keys per SCAN this pass. Lost: a pass starts again."""
        return f"{self.prefix}:sweep"

    @property
    def sweep_lock(self) -> str:
        """STRING with a TTL: the resolve worker sweeping the next page."""
        return f"{self.prefix}:sweep-lock"

    @property
    def housekeeping_lock(self) -> str:
        """STRING with a TTL: the resolve worker retiring the next page of sessions."""
        return f"{self.prefix}:housekeeping-lock"

