"""Model-based test: hypothesis drives the real service (Redis, resolve worker, dramatiq
workers that really die) and the in-memory model with the same random steps, and compares every
result and the pending list after each step. ``MODEL_EXAMPLES`` sets the number of sequences
(200 by default; thousands for a long run).

The model says a crashing handler's next attempt is started (and counted as a stall). That
holds only if a worker is there to start it within the dispatch timeout; so after a step in
which a handler really crashed its worker process, the test waits for the restarted dramatiq
to say it is ready, as an agent's operator would, however long the restart takes."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from pending_actions.producers import PendingActions
from tests.support.faults import K, cluster, wait_for
from tests.support.model import APPLY, REJECT, Entry, Model
from tests.support.replies import tail_id
from tests.support.runs import runs

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2

MAX_STALLS = 2
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "200"))
# crash is rarer than the rest: each costs a lease expiry and a worker restart
APPLY_CHOICES = ["ok", "ok", "ok", "toolerror", "boom", "crash"]


def test_service_matches_the_model(tmp_path: Path) -> None:
    with cluster(tmp_path, lease_ms="500", recovery_interval_ms="50",
                 max_stalls=str(MAX_STALLS)) as (server, _workers, pa):
        rc = redis.Redis.from_url(server.url)
        machine = make_machine(pa, rc)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=15, deadline=None,
            suppress_health_check=list(HealthCheck)))
        rc.close()


def crashes(rc: redis.Redis, session: str) -> int:
    """How many times t.crash has killed its worker process in this session."""
    return sum(1 for r in runs(rc, session) if r["handler"] == "t.crash")


def make_machine(pa: PendingActions, rc: redis.Redis) -> type[RuleBasedStateMachine]:
    class ServiceVsModel(RuleBasedStateMachine):
        @initialize()
        def fresh(self) -> None:
            self.model = Model(MAX_STALLS)
            prefix = uuid.uuid4().hex[:8]
            self.names = [f"m{prefix}a", f"m{prefix}b"]

        @rule(i=st.integers(0, 1), apply=st.sampled_from(APPLY_CHOICES),
              reject=st.sampled_from([None, "text", "raise"]), label=st.text(
                  st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
                  min_size=1, max_size=12).filter(str.strip))
        def stage(self, i: int, apply: str, reject: str | None, label: str) -> None:
            s = self.names[i]
            action_id = pa.stage(session=s, tool="edit", label=label, apply=APPLY[apply],
                                 reject=REJECT[reject])
            self.model.stage(s, Entry(action_id, label, apply, reject))

        @rule(i=st.integers(0, 1), action=st.sampled_from(["apply", "apply", "discard"]),
              reason=st.text(max_size=8))
        def resolve(self, i: int, action: str, reason: str) -> None:
            s = self.names[i]
            expected = self.model.resolve(s, action, reason)
            mark, crashed = tail_id(rc, K.workers), crashes(rc, s)
            got = pa.resolve(session=s, action=action, reason=reason, timeout=30)
            if crashes(rc, s) > crashed:  # dramatiq is restarting: wait until it is back
                wait_for(rc, K.workers, lambda f: f[b"role"] == b"dramatiq" and
                         f[b"event"] == b"ready", mark, timeout=120)
            assert (got.is_error, got.text) == (expected.is_error, expected.text)
            assert got.details.get("label") == expected.label
            assert got.details["action"] == action and got.details["reason"] == reason

        @rule(i=st.integers(0, 1), apply=st.sampled_from(APPLY_CHOICES),
              reject=st.sampled_from([None, "text", "raise"]))
        def set_directive(self, i: int, apply: str, reject: str | None) -> None:
            s = self.names[i]
            did = pa.set_directive(s, tool="plan", label="directive", apply=APPLY[apply],
                                   reject=REJECT[reject])
            self.model.s(s).directive = Entry(did, "directive", apply, reject)

        @rule(i=st.integers(0, 1), apply=st.sampled_from(["ok", "toolerror", "boom"]))
        def set_standing(self, i: int, apply: str) -> None:
            s = self.names[i]
            sid = pa.set_standing(s, tool="mode", label="standing", apply=APPLY[apply])
            self.model.s(s).standing = Entry(sid, "standing", apply, None)

        @rule(i=st.integers(0, 1))
        def clear_standing(self, i: int) -> None:
            s = self.names[i]
            assert pa.clear_standing(s) is (self.model.s(s).standing is not None)
            self.model.s(s).standing = None

        @rule(i=st.integers(0, 1))
        def observe(self, i: int) -> None:
            s = self.names[i]
            choice = pa.next_tool_choice(s)
            assert (choice or {}).get("id") == self.model.next_choice(s)
            assert [d["id"] for d in pa.dead_letters(s)] == list(reversed(self.model.s(s).dead))

        def teardown(self) -> None:
            for s in getattr(self, "names", []):
                got = pa.pending(s)
                assert [a.id for a in got] == self.model.pending_ids(s)
                assert all(a.state == "pending" for a in got)
                model_attempts = {e.id: e.attempts for e in self.model.s(s).stack}
                assert {a.id: a.attempts for a in got} == model_attempts

    return ServiceVsModel
