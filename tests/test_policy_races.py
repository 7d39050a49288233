"""Policies under concurrency, with real processes: six approvers racing on a two-approval
action apply it exactly once; a policy changed while stages are in flight decides each stage
by the version its script saw (the feed of each partition never goes back to an older one, and
every decision is the one its version makes)."""

from __future__ import annotations

import subprocess
import sys
import time
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


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def spawn(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.support.policy_procs", *args],
                            env=worker_env(url), cwd=ROOT, stdout=subprocess.PIPE, text=True)


def decided_by(rc: Any, tenant: str, version: int, timeout_s: float = 60) -> None:
    """Returns once some partition's feed holds a stage of ``tenant`` decided by ``version``
    (staged or denied), as the stages go on."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for p in range(K.partitions):
            for _e, f in entries(rc.xrevrange(K.events(p), count=200)):
                if f.get(b"tenant") == tenant.encode() and f.get(b"policy") == b"%d" % version:
                    return
        rc.blpop(["test:never"], timeout=0.05)  # the next look, a moment later
    raise AssertionError(f"no stage of {tenant} decided by version {version} in {timeout_s} s")


def test_six_approvers_racing_on_two_approvals_apply_once(deployment: Deployment) -> None:
    pa, rc = deployment.pa, deployment.rc
    tenant, session = f"r-{uuid.uuid4().hex[:8]}", f"race-{uuid.uuid4().hex[:8]}"
    pa.set_policy({"rules": [{"name": "two", "match": {"tool": "deploy"}, "decision": "ask",
                              "approvals": 2}]}, tenant=tenant)
    action_id = pa.stage(session=session, tool="deploy", label="Deploy", apply="t.ok",
                         tenant=tenant)
    procs = [spawn(deployment.url, "approve", session, f"person-{i}") for i in range(6)]
    try:
        for _ in range(6):  # every approver connected, then all let go at once
            assert rc.blpop([f"test:ready:{session}"], timeout=60) is not None
        rc.rpush(f"test:go:{session}", *["go"] * 6)
        results = [Result.model_validate_json(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for proc in procs:
            proc.kill()
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
        for _ in procs:
            assert rc.blpop([f"test:ready:{prefix}"], timeout=60) is not None
        # each version is changed only once stages were decided by the one before
        for v in (2, 3):
            decided_by(rc, tenant, v - 1)
            assert pa.set_policy(document(v), tenant=tenant) == v
        decided_by(rc, tenant, 3)
        rc.set(f"test:stop:{prefix}", 1)
        outs = [p.communicate(timeout=60)[0].split() for p in procs]
    finally:
        for proc in procs:
            proc.kill()
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
