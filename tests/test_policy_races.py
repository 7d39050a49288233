"""Policies under concurrency, with real processes: six approvers racing on a two-approval
action apply it exactly once; a policy changed while stages are in flight decides each stage
by the version its script saw (the feed of each partition never goes back to an older one, and
every decision is the one its version makes)."""

from __future__ import annotations

import sys
import uuid
from collections import defaultdict
from typing import Any

import orjson
import pytest

from pending_actions.broker.models import Result
from pending_actions.procs import ROOT
from tests.conftest import Deployment, both
from tests.support.faults import K
from tests.support.procs import worker_env
from tests.support.replies import entries
from tests.support.runs import runs
from tests.support.waits import Watched, wait_until

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def spawn(url: str, *args: str) -> Watched:
    """A process of tests/support/policy_procs.py, its stdout and stderr kept for the failure
    that needs them."""
    return Watched.start(f"policy_procs {' '.join(args)}",
                         [sys.executable, "-m", "tests.support.policy_procs", *args],
                         env=worker_env(url), cwd=ROOT)


def all_ready(rc: Any, key: str, procs: list[Watched], timeout_s: float = 60) -> None:
    """Every process said ready on ``key``; one that exits first fails at once with what it
    wrote, and the deadline names the ones that never said it."""
    said: list[bytes] = []

    def one_more() -> bool:
        got = rc.blpop([key], timeout=0.5)
        if got is not None:
            said.append(got[1])
        return len(said) >= len(procs)

    wait_until(one_more, timeout_s, lambda: f"{len(procs)} processes ready on {key} "
               f"(ready: {sorted(s.decode() for s in said)})", interval_s=0, watching=procs)


def decided_by(rc: Any, tenant: str, version: int, procs: list[Watched],
               timeout_s: float = 60) -> None:
    """Returns once some partition's feed holds a stage of ``tenant`` decided by ``version``
    (staged or denied), as the stages go on; a stager that exits meanwhile fails it at once."""

    def seen() -> bool:
        return any(f.get(b"tenant") == tenant.encode() and f.get(b"policy") == b"%d" % version
                   for p in range(K.partitions)
                   for _e, f in entries(rc.xrevrange(K.events(p), count=200)))

    wait_until(seen, timeout_s, f"a stage of {tenant} decided by version {version}",
               watching=procs)


def test_six_approvers_racing_on_two_approvals_apply_once(deployment: Deployment) -> None:
    pa, rc = deployment.pa, deployment.rc
    tenant, session = f"r-{uuid.uuid4().hex[:8]}", f"race-{uuid.uuid4().hex[:8]}"
    pa.set_policy({"rules": [{"name": "two", "match": {"tool": "deploy"}, "decision": "ask",
                              "approvals": 2}]}, tenant=tenant)
    action_id = pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok",
                         tenant=tenant)
    procs = [spawn(deployment.url, "approve", session, f"person-{i}") for i in range(6)]
    try:
        all_ready(rc, f"test:ready:{session}", procs)  # every approver connected,
        rc.rpush(f"test:go:{session}", *["go"] * 6)  # then all let go at once
        results = [Result.model_validate_json(p.output(timeout_s=60)) for p in procs]
    finally:
        for proc in procs:
            proc.close()
    applied = [r for r in results if r.text == f"applied {action_id}"]
    approved = [r for r in results if r.text.startswith("Approved 1 of 2")]
    assert len(applied) == 1 and len(approved) == 1, [r.text for r in results]
    assert all(r.is_error and "No pending action" in r.text
               for r in results if r not in applied and r not in approved)
    assert [run["id"] for run in runs(rc, session)] == [action_id]


def test_a_policy_change_under_load_decides_each_stage_by_one_version(
        deployment: Deployment) -> None:
    pa, rc = deployment.pa, deployment.rc
    tenant, prefix = f"l-{uuid.uuid4().hex[:8]}", f"load-{uuid.uuid4().hex[:6]}"
    # each version's decision as the feed shows it (a plain allow it leaves unsaid)
    versions = {1: ("ask", 1), 2: ("ask", 2), 3: ("deny", 0)}

    def document(v: int) -> dict[str, object]:
        decision, approvals = versions[v]
        rule: dict[str, object] = {"name": f"v{v}", "match": {"tool": "deploy"},
                                   "decision": decision}
        if approvals:
            rule["approvals"] = approvals
        else:
            rule["reason"] = "frozen"
        return {"rules": [rule]}

    assert pa.set_policy(document(1), tenant=tenant) == 1
    procs = [spawn(deployment.url, "stage", tenant, f"{prefix}{i}", prefix) for i in range(3)]
    try:
        all_ready(rc, f"test:ready:{prefix}", procs)
        # each version is changed only once stages were decided by the one before
        for v in (2, 3):
            decided_by(rc, tenant, v - 1, procs)
            assert pa.set_policy(document(v), tenant=tenant) == v
        decided_by(rc, tenant, 3, procs)
        rc.set(f"test:stop:{prefix}", 1)
        outs = [p.output(timeout_s=60).split() for p in procs]
    finally:
        for proc in procs:
            proc.close()
    staged, denied = sum(int(o[0]) for o in outs), sum(int(o[1]) for o in outs)
    assert staged > 0 and denied > 0, outs
    seen: dict[int, list[int]] = defaultdict(list)
    counted = 0
    for p in range(K.partitions):
        for _e, f in entries(rc.xrange(K.events(p))):
            if f.get(b"tenant") != tenant.encode() or f[b"event"] not in (b"staged",
                                                                          b"denied"):
                continue
            version = int(f[b"policy"])
            decision = f.get(b"decision", b"deny").decode()
            assert (decision, int(f.get(b"approvals", 0))) == versions[version], (version, f)
            assert f[b"rule"] == f"v{version}".encode()
            seen[p].append(version)
            counted += 1
    assert counted == staged + denied
    for part, order in seen.items():
        assert order == sorted(order), f"partition {part} went back to an older version"
    assert {v for order in seen.values() for v in order} == {1, 2, 3}
    for session in {f"{prefix}{i}-{n}" for i in range(3) for n in range(8)}:
        for a in pa.pending(session):
            assert a.policy is not None and (a.policy["decision"], a.policy["approvals"]) == \
                versions[a.policy["version"]]
    assert orjson.loads(orjson.dumps(pa.get_policy(tenant)))["version"] == 3
