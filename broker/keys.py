"""Every Redis key name, in one place.

A session's keys all carry the hash tag ``{<session>}`` so that each Lua script touches one
Redis Cluster slot. Global keys (counter, request stream, indexes) are only touched by plain
commands or single-key scripts, never together with session keys.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "pa"

    # --- per session: one slot -------------------------------------------------------------
    def _s(self, session: str, name: str) -> str:
        return f"{self.prefix}:{{{session}}}:{name}"

    def stack(self, session: str) -> str:
        """LIST of pending action ids, head (newest) on the left."""
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

    def expiry(self, session: str) -> str:
        """ZSET of the session's actions staged with a ttl, score the expiry time in ms: every
        reader treats one past its score as gone, before the sweep ends it."""
        return self._s(session, "expiry")

    def expired(self, session: str) -> str:
        """ZSET of the session's actions that ended as expired, score when, trimmed to the last
        ``expired_memory_s``: lets a late ``resolve(expect_id=)`` be told why."""
        return self._s(session, "expired")

    def request_marker(self, session: str, request_id: str) -> str:
        """STRING with a TTL: a resolve request already taken (dedupes redelivered requests)."""
        return self._s(session, f"req:{request_id}")

    def reply(self, session: str, request_id: str) -> str:
        """LIST with a TTL: where the resolver waits (BLPOP) for its result."""
        return self._s(session, f"reply:{request_id}")

    # --- global ---------------------------------------------------------------------------
    @property
    def seq(self) -> str:
        """Counter behind every ``pending-action:<tool>:<seq>`` id."""
        return f"{self.prefix}:seq"

    @property
    def requests(self) -> str:
        """STREAM of resolve requests, read by resolve workers through a consumer group."""
        return f"{self.prefix}:requests"

    @property
    def requests_dead(self) -> str:
        """STREAM of malformed entries taken off the request stream, with the reason."""
        return f"{self.prefix}:requests:dead"

    @property
    def leases(self) -> str:
        """ZSET of every live lease, member ``<session>/<token>`` (see ``lease_member``), score
        its deadline in ms: tells recovery where to look without scanning sessions."""
        return f"{self.prefix}:leases"

    @staticmethod
    def lease_member(session: str, token: str) -> str:
        # "/" never occurs in a session id, so the member splits back unambiguously
        return f"{session}/{token}"

    @staticmethod
    def parse_lease_member(member: bytes | str) -> tuple[str, str]:
        text = member.decode() if isinstance(member, bytes) else member
        session, _, token = text.rpartition("/")
        return session, token

    @property
    def expiries(self) -> str:
        """ZSET of every action staged with a ttl, member ``<session>/<id>`` (see
        ``lease_member``), score its expiry in ms: where the recovery loop finds what to end."""
        return f"{self.prefix}:expiries"

    @property
    def sweep_lock(self) -> str:
        """STRING with a TTL: the resolve worker running the full lease sweep right now."""
        return f"{self.prefix}:sweep-lock"

    @property
    def swept(self) -> str:
        """STRING: run_id of the Redis server whose data the last full lease sweep covered."""
        return f"{self.prefix}:swept"

    @property
    def handlers(self) -> str:
        """HASH handler name -> JSON about the worker that registered it."""
        return f"{self.prefix}:handlers"

    @property
    def sessions(self) -> str:
        """SET of every session that ever staged something (for stats and sweeps)."""
        return f"{self.prefix}:sessions"

    @property
    def workers(self) -> str:
        """STREAM of worker lifecycle events (ready, stopping)."""
        return f"{self.prefix}:workers"

    def task_queue(self, queue: str) -> str:
        """STREAM backing a dramatiq queue."""
        return f"{self.prefix}:dq:{queue}"

    def task_dead(self, queue: str) -> str:
        """STREAM of dramatiq messages that were nacked."""
        return f"{self.prefix}:dq:{queue}:dead"

    # --- people and operators: tenants, tokens, events (used by ``serve``) ------------------
    def tenant(self, session: str) -> str:
        """STRING: the tenant the session belongs to; set by its first stage, never changed."""
        return self._s(session, "tenant")

    def tenant_sessions(self, tenant: str) -> str:
        """SET of the sessions of one tenant (what the inbox scans)."""
        return f"{self.prefix}:tenant:{tenant}:sessions"

    @property
    def tokens(self) -> str:
        """HASH sha256(token) -> JSON {name, tenant, role, created_at}: never the token itself."""
        return f"{self.prefix}:{{tokens}}:by-hash"

    @property
    def token_names(self) -> str:
        """HASH token name -> sha256(token), for revocation by name."""
        return f"{self.prefix}:{{tokens}}:by-name"

    @property
    def events(self) -> str:
        """STREAM of every stage and outcome across sessions, capped: what webhooks and metrics
        read. A session's own history stays the record; this is a feed."""
        return f"{self.prefix}:events"

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
    def housekeeping_lock(self) -> str:
        """STRING with a TTL: the resolve worker retiring the next page of sessions."""
        return f"{self.prefix}:housekeeping-lock"

    RESOLVER_GROUP = "resolvers"
    TASK_GROUP = "workers"
