"""The client's side of policies: every tenant's policy is read from Redis once per version,
compiled (``broker/policy/rules.py``) and kept; a stage decides its actions with the version the
client last saw and stage.lua checks that version against the partition's marker (a stage
decided by another is refused, and decided again: ``producers/staging.py``). Setting a policy
writes a new version, then raises every partition's marker (docs/design.md, Policies)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, cast

import orjson

from pending_actions.broker import texts
from pending_actions.broker.atomic.scripts import Scripts, ToStage
from pending_actions.broker.errors import Damaged, Denied, InvalidInput
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import DEFAULT_TENANT, ResolveRequest, check_tenant, spec_json
from pending_actions.broker.payloads import check_json
from pending_actions.broker.policy.rules import AUTO_BY, Policy, Verdict, read_document
from pending_actions.broker.settings import Settings
from pending_actions.producers.plans import Batch, Plan, Run

BY_CHARS = 128


class PolicyPlans:
    """Mixed into ``Staging``: the versions seen and compiled, and the policy plans."""

    settings: Settings
    keys: Keys
    scripts: Scripts

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}  # tenant -> the version last seen ("": none)
        self._compiled: dict[tuple[str, str], Policy] = {}
        self._policy_lock = threading.Lock()

    def policy_version(self, tenant: str) -> str:
        """The version of ``tenant``'s policy this client decides by now ("": none; a guess
        that stage.lua corrects)."""
        return self._seen.get(tenant, "")

    def policy_of(self, tenant: str, version: str) -> Policy | None:
        """The compiled ``version`` (read before by ``load_policy``), None for no policy."""
        return self._compiled.get((tenant, version)) if version else None

    def load_policy(self, tenant: str, version: str) -> Plan[None]:
        """Read and compile ``version`` of ``tenant``'s policy unless it is at hand, and decide
        by it from now on."""
        if version and (tenant, version) not in self._compiled:
            raw, = yield Batch(lambda p: p.hget(self.keys.policy(tenant), version))
            if raw is None:
                raise Damaged(f"the policy markers name version {version} of tenant {tenant!r}'s "
                              f"policy, which {self.keys.policy(tenant)} does not hold (deleted "
                              "by hand?): nothing was staged; set the policy again")
            policy = Policy(orjson.loads(raw)["document"], int(version))
            with self._policy_lock:
                if len(self._compiled) >= 1_000:  # versions no stage decides by any more go
                    self._compiled = {key: p for key, p in self._compiled.items()
                                      if self._seen.get(key[0]) == key[1]}
                self._compiled[(tenant, version)] = policy
        with self._policy_lock:
            self._seen[tenant] = version

    def decide(self, *, session: str, tool: str, apply: str, label: str,
               payload: dict[str, Any], tenant: str = DEFAULT_TENANT,
               reject: str | None = None) -> Plan[Verdict | None]:
        """What the version of ``tenant``'s policy in force in ``session``'s partition decides
        for such an action (``Policy.decide``: both handlers), None without a policy: for a
        caller that acts on a decision without staging (``mcp-proxy`` forwards what is
        allowed, refuses what is denied; a slot; an edit). One read of the partition's
        marker; the version itself is read once."""
        verdict, _version = yield from self.decided(
            session=session, tool=tool, apply=apply, label=label, payload=payload,
            tenant=tenant, reject=reject)
        return verdict

    def decided(self, *, session: str, tool: str, apply: str, label: str,
                payload: dict[str, Any], tenant: str = DEFAULT_TENANT,
                reject: str | None = None) -> Plan[tuple[Verdict | None, str]]:
        """``decide``'s verdict and the version of the policy it is by ("" for none), which a
        later step checks is still in force (an edit's take)."""
        check_tenant(tenant)
        markers = self.keys.policy_markers(self.keys.partition(session))
        raw, = yield Batch(lambda p: p.hget(markers, tenant))
        version = raw.decode() if raw else ""
        yield from self.load_policy(tenant, version)
        policy = self.policy_of(tenant, version)
        if policy is None:
            return None, version
        return policy.decide(tool=tool, apply=apply, label=label, session=session,
                             payload=payload, reject=reject), version

    def to_stage(self, s: dict[str, Any], verdict: Verdict | None) -> ToStage:
        """One action of a stage.lua call, with what ``verdict`` decided for it."""
        ttl_ms = None if s["ttl"] is None else int(s["ttl"] * 1000)
        base = (s["id"], spec_json(s), ttl_ms, f"{s['created_at']:.3f}")
        if verdict is None:
            return ToStage(*base)
        rule = verdict.rule or ""
        if verdict.decision == "deny":
            return ToStage(*base, "deny", rule, verdict.reason or "")
        if verdict.decision == "ask":
            return ToStage(*base, "ask", rule, str(verdict.approvals))
        if not verdict.auto:
            return ToStage(*base, "allow", rule)
        # applied at once: the lease and the resolve request are written by stage.lua itself
        req, token = uuid.uuid4().hex, uuid.uuid4().hex
        wait_ms = self.settings.dispatch_timeout_ms
        # the stage decided it: its context is the deciding one, so the take and the handler's
        # span are in the stage's trace (stage.lua keeps it in the lease too)
        request = ResolveRequest.encode(req, s["session"], "apply", texts.auto_reason(rule), None,
                                        wait_ms, int(time.time() * 1000) + wait_ms, s["id"],
                                        AUTO_BY + rule, None, s["trace"])
        return ToStage(*base, "auto", rule, token.encode() + request, req)

    def get_policy(self, tenant: str = DEFAULT_TENANT) -> Plan[dict[str, Any] | None]:
        check_tenant(tenant)
        raw, = yield Batch(lambda p: p.hget(self.keys.policy(tenant), "current"))
        return cast(dict[str, Any], orjson.loads(raw)) if raw is not None else None

    def set_policy(self, document: object, tenant: str = DEFAULT_TENANT,
                   by: str | None = None) -> Plan[int]:
        """A new version: checked (one error naming the rule and the field, nothing written),
        written with every earlier one kept, then in force in every partition."""
        check_tenant(tenant)
        if by is not None and (not isinstance(by, str) or not 0 < len(by) <= BY_CHARS):
            raise InvalidInput("by", f"must be a string of 1-{BY_CHARS} characters")
        if isinstance(document, str | bytes):
            document = read_document(document, max_bytes=self.settings.max_payload_bytes)
        check_json(document, "policy", self.settings.max_payload_bytes)
        Policy(cast(dict[str, Any], document))  # checked there: InvalidInput
        rest = b"," + orjson.dumps({"set_at": round(time.time(), 3), "by": by,
                                    "document": document})[1:]
        version: int = yield Run(self.scripts.set_policy(tenant, rest=rest))
        yield from self.mark_policies(tenant, version)
        return version

    def mark_policies(self, tenant: str, version: int) -> Plan[None]:
        """Raise every partition's marker of ``tenant`` to ``version`` (a no-op where it is)."""
        calls = [self.scripts.mark_policy(p, tenant=tenant, version=version)
                 for p in range(self.keys.partitions)]
        yield Batch(lambda pipe: [c.on(pipe) for c in calls])


def raise_denied(specs: list[dict[str, Any]]) -> None:
    """Raise ``Denied`` when a stage's policy denied any of its specs (the others staged)."""
    denied = [s for s in specs if s["verdict"] is not None and s["verdict"].decision == "deny"]
    if denied:
        first: Verdict = denied[0]["verdict"]
        gone = {s["id"] for s in denied}
        raise Denied(first.reason, first.rule,
                     [{"id": s["id"], "rule": s["verdict"].rule, "reason": s["verdict"].reason}
                      for s in denied],
                     [None if s["id"] in gone else s["id"] for s in specs])
