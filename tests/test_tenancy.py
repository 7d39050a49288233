"""Tenancy as an invariant (issue 29, items 1 and 5), tried as an adversary would, on one Redis
and on a cluster: a stage refused writes nothing at all (every key and value compared before
and after, but the id blocks it reserved, as documented), whichever client makes it (the
blocking one, the asyncio one, the CLI's ``stage --tenant``); a view shows a session to a
tenant only when the session's owner record names that tenant, so a stray index entry shows
nothing; a session whose owner record is lost is nobody's to stage into or to see, but in the
operator's all-tenant view (``--unowned``), until ``repair`` restores the record from the
session's own keys."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from pending_actions.broker.errors import Damaged, Forbidden, UnknownHandler, Unowned
from pending_actions.broker.keys import Keys
from pending_actions.procs import ROOT
from pending_actions.producers import AsyncPendingActions, PendingActions
from pending_actions.views import inbox
from tests.conftest import Deployment, both
from tests.support.procs import worker_env
from tests.support.replies import entries
from tests.support.unchanged import live, redis_unchanged
from tests.support.waits import wait_until

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

CLIENTS = ["sync", "async", "cli"]


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def ids_reserved(k: Keys) -> Callable[[bytes], bool]:
    """What a refused stage may still write, as documented: the id blocks it reserved (each
    partition's counter and its mark), besides what a running deployment rewrites itself."""
    base = live(k)
    return lambda key: base(key) or key.endswith((b":seq", b":seq:mark"))


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args],
                          env=worker_env(url), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def stage_as(client: str, d: Deployment, session: str, tenant: str,
             apply: str = "t.ok") -> Exception | str:
    """A stage by a fresh client of that kind (no id block of its own yet): the error it
    raised (for the CLI, its exit code and its one line), or the id."""
    fields: dict[str, Any] = {"session": session, "tool": "edit", "label": "sneak",
                              "apply": apply, "payload": {"mine": True}, "tenant": tenant}
    if client == "cli":
        out = cli(d.url, "stage", "--session", session, "--tool", "edit", "--label", "sneak",
                  "--apply", apply, "--payload", '{"mine": true}', "--tenant", tenant)
        if out.returncode == 0:
            return out.stdout.strip()
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # one line, no traceback
        return RuntimeError(f"exit {out.returncode}: {out.stderr.strip()}")
    try:
        if client == "async":
            async def go() -> str:
                async with AsyncPendingActions(d.pa.settings) as apa:
                    return await apa.stage(**fields)
            return asyncio.run(go())
        pa = PendingActions(d.pa.settings)
        try:
            return pa.stage(**fields)
        finally:
            pa.close()
    except Exception as exc:
        return exc


def refused(got: Exception | str, kind: type[Exception], text: str, code: int = 1) -> None:
    if isinstance(got, RuntimeError):  # the CLI's
        assert str(got).startswith(f"exit {code}: ") and text in str(got), got
    else:
        assert isinstance(got, kind) and text in str(got), repr(got)


class Victim:
    """A session of tenant t2 with a secret, and t1: a tenant of its own."""

    def __init__(self, pa: PendingActions) -> None:
        tag = uuid.uuid4().hex[:8]
        self.t1, self.t2 = f"t1-{tag}", f"t2-{tag}"
        self.session = f"v-{tag}"
        self.ids = [pa.stage(session=self.session, tool="edit", label="secret", apply="t.ok",
                             payload={"secret": f"s-{tag}"}, tenant=self.t2)]
        k = pa.ctx.keys
        self.partition = k.partition(self.session)


@pytest.fixture
def victim(pa: PendingActions) -> Victim:
    return Victim(pa)


def feed_of(d: Deployment, v: Victim) -> list[dict[bytes, bytes]]:
    k = d.pa.ctx.keys
    return [f for _e, f in entries(d.rc.xrange(k.events(v.partition)))
            if f[b"session"] == v.session.encode()]


@pytest.mark.parametrize("client", CLIENTS)
def test_another_tenants_session_is_refused_and_nothing_is_written(
        deployment: Deployment, victim: Victim, client: str) -> None:
    d, k = deployment, deployment.pa.ctx.keys
    with redis_unchanged(d.rc, live(k)):  # not even an id block
        got = stage_as(client, d, victim.session, victim.t1)
    refused(got, Forbidden, "belongs to another tenant")
    # the index entry, the feed entry and the view of item 1 were never made
    assert not d.rc.exists(k.tenant_index(victim.partition, victim.t1))
    assert [f[b"tenant"] for f in feed_of(d, victim)] == [victim.t2.encode()]
    assert inbox(d.pa, victim.t1) == []
    assert [a["id"] for a in inbox(d.pa, victim.t2)] == victim.ids


@pytest.mark.parametrize("client", CLIENTS)
def test_an_unknown_handler_is_refused_before_any_id_is_reserved(
        deployment: Deployment, client: str) -> None:
    d = deployment
    with redis_unchanged(d.rc):  # not even an id block
        got = stage_as(client, d, f"new-{uuid.uuid4().hex[:8]}", "t-any", apply="no.such")
    refused(got, UnknownHandler, "no live worker has a handler named 'no.such'", code=2)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_session_whose_owner_record_is_lost_is_nobodys(
        deployment: Deployment, victim: Victim, client: str) -> None:
    """Item 5: its field deleted from the sessions hash, the session is refused to every
    tenant, its own included (it cannot be told), and shown to none."""
    d, k = deployment, deployment.pa.ctx.keys
    d.rc.hdel(k.sessions(victim.partition), victim.session)
    for tenant in (victim.t1, victim.t2):
        with redis_unchanged(d.rc, live(k)):  # not even an id block
            got = stage_as(client, d, victim.session, tenant)
        refused(got, Unowned, "has keys but no owner record")
        assert isinstance(got, Forbidden | RuntimeError)  # serve answers it as a 404
    assert inbox(d.pa, victim.t1) == [] and inbox(d.pa, victim.t2) == []
    assert d.pa.tenant_of(victim.session) is None
    # restored from what the session's own keys say (its spec names t2)
    out = cli(d.url, "--json", "repair", "--session", victim.session)
    assert out.returncode == 0, out.stderr
    assert orjson.loads(out.stdout) == [{"session": victim.session, "outcome": "restored",
                                         "note": f"owner record restored: {victim.t2}"}]
    assert [a["id"] for a in inbox(d.pa, victim.t2)] == victim.ids
    assert isinstance(stage_as(client, d, victim.session, victim.t1), Forbidden | RuntimeError)


def test_views_check_every_session_against_its_owner_record(deployment: Deployment,
                                                            victim: Victim) -> None:
    """A stray index entry (t1's index naming t2's session) shows nothing to t1 anywhere; a
    session with no record shows only in the operator's all-tenant view that asks for it
    (--unowned), marked."""
    d, k = deployment, deployment.pa.ctx.keys
    d.rc.sadd(k.tenant_index(victim.partition, victim.t1), victim.session)
    # a dead letter of the victim's, as park.lua leaves one
    d.rc.rpush(k.dead(victim.session), orjson.dumps({"id": "pending-action:edit:1",
                                                      "reason": "secret reason"}))
    for args in (("ls", "--all", "--tenant", victim.t1),
                 ("dead", "--all", "--tenant", victim.t1)):
        out = cli(d.url, "--json", *args)
        assert out.returncode == 0 and orjson.loads(out.stdout) == [], out.stdout
    assert inbox(d.pa, victim.t1) == []
    mine = cli(d.url, "--json", "ls", "--all", "--tenant", victim.t2)
    assert [a["id"] for a in orjson.loads(mine.stdout)] == victim.ids
    dead = cli(d.url, "--json", "dead", "--all", "--tenant", victim.t2)
    assert [x["reason"] for x in orjson.loads(dead.stdout)] == ["secret reason"]

    d.rc.hdel(k.sessions(victim.partition), victim.session)
    assert cli(d.url, "--json", "ls", "--all", "--tenant", victim.t2).stdout.strip() == "[]"
    for view in ("ls", "dead"):  # every owner's sessions: not one with no owner
        assert victim.session not in cli(d.url, view, "--all").stdout
    every = [a for a in orjson.loads(cli(d.url, "--json", "ls", "--all", "--unowned").stdout)
             if a["session"] == victim.session]
    assert [(a["id"], a.get("unowned")) for a in every] == [(victim.ids[0], True)]
    letters = [x for x in orjson.loads(cli(d.url, "--json", "dead", "--all", "--unowned").stdout)
               if x["session"] == victim.session]
    assert [(x["reason"], x.get("unowned")) for x in letters] == [("secret reason", True)]
    assert cli(d.url, "--json", "dead", "--all", "--tenant", victim.t2).stdout.strip() == "[]"
    text = cli(d.url, "ls", "--all", "--unowned").stdout
    assert f"{victim.session} (unowned)  {victim.ids[0]}" in text
    assert cli(d.url, "ls", "--all", "--unowned", "--tenant", victim.t2).returncode == 2
    assert cli(d.url, "repair", "--session", victim.session).returncode == 0
    assert [a["id"] for a in inbox(d.pa, victim.t2)] == victim.ids


def test_repair_needs_the_operators_word_where_the_keys_say_nothing(
        deployment: Deployment) -> None:
    """A session of the default tenant whose history is all that is left names no tenant
    (the default's entries name none, and an older version's neither): left as it is (exit 1)
    until the operator names one; a session whose keys name another tenant is left as well."""
    d, k = deployment, deployment.pa.ctx.keys
    session = f"hist-{uuid.uuid4().hex[:8]}"
    d.pa.stage(session=session, tool="edit", label="l", apply="t.ok")
    assert not d.pa.resolve(session=session, action="apply", reason="done").is_error
    d.rc.hdel(k.sessions(k.partition(session)), session)
    out = cli(d.url, "repair", "--session", session)
    assert out.returncode == 1 and "name it with --tenant" in out.stdout, out.stdout
    other = cli(d.url, "repair", "--session", session, "--tenant", "someone")
    assert other.returncode == 0 and d.pa.tenant_of(session) == "someone"

    theirs = Victim(d.pa)
    d.rc.hdel(k.sessions(theirs.partition), theirs.session)
    out = cli(d.url, "repair", "--session", theirs.session, "--tenant", theirs.t1)
    assert out.returncode == 1 and f"name {theirs.t2}, not {theirs.t1}" in out.stdout
    assert d.pa.tenant_of(theirs.session) is None


@pytest.fixture
def set_back(deployment: Deployment, victim: Victim) -> Iterator[int]:
    """The victim's partition's counter and mark set back to just below its action's id, as a
    failover without REPLICA_WAIT (or a hand) would leave them; put forward again after."""
    k, rc = deployment.pa.ctx.keys, deployment.rc
    seq = int(victim.ids[0].rpartition(":")[2])
    before = max(int(rc.get(k.seq(victim.partition)) or 0),
                 int(rc.get(k.seq_mark(victim.partition)) or 0))
    for key in (k.seq(victim.partition), k.seq_mark(victim.partition)):
        rc.set(key, seq // k.partitions - 1)
    yield seq
    after = max(int(rc.get(k.seq(victim.partition)) or 0), before) + 1000
    for key in (k.seq(victim.partition), k.seq_mark(victim.partition)):
        rc.set(key, after)


@pytest.mark.parametrize("client", CLIENTS)
def test_an_id_handed_out_again_is_a_collision_never_a_silent_loss(
        deployment: Deployment, victim: Victim, set_back: int, client: str) -> None:
    """Before, stage.lua took an id it already held for a retry's: the new action was dropped
    and its id returned as if staged. Now a different spec under that id changes nothing and
    fails clearly, and the client's next ids start past it."""
    d, k = deployment, deployment.pa.ctx.keys
    with redis_unchanged(d.rc, ids_reserved(k)):
        got = stage_as(client, d, victim.session, victim.t2)
    refused(got, Damaged, f"id {victim.ids[0]} already holds another action")
    assert [a.label for a in d.pa.pending(victim.session)] == ["secret"]
    if client == "sync":  # a client that met the collision: its next ids start past it
        for key in (k.seq(victim.partition), k.seq_mark(victim.partition)):
            d.rc.set(key, set_back // k.partitions - 1)
        pa = PendingActions(d.pa.settings)
        try:
            with pytest.raises(Damaged):
                pa.stage(session=victim.session, tool="edit", label="x", apply="t.ok",
                         tenant=victim.t2)
            again = pa.stage(session=victim.session, tool="edit", label="x", apply="t.ok",
                             tenant=victim.t2)
        finally:
            pa.close()
        assert int(again.rpartition(":")[2]) > set_back
        assert [a.id for a in d.pa.pending(victim.session)] == [again, *victim.ids]


def test_the_unchanged_check_sees_a_stage(deployment: Deployment, victim: Victim) -> None:
    """The check above can fail, on a cluster too (its snapshot reads every master): a stage
    that goes through shows up."""
    with pytest.raises(AssertionError, match="Redis changed"), \
            redis_unchanged(deployment.rc, ids_reserved(deployment.pa.ctx.keys)):
        assert isinstance(stage_as("sync", deployment, victim.session, victim.t2), str)


def test_the_unchanged_check_tells_an_expiry_from_a_delete(deployment: Deployment) -> None:
    """A key whose TTL runs out during the call is no change (an earlier resolve's request
    marker, say); the same key deleted before its time is one."""
    rc, key = deployment.rc, f"pa-test:{uuid.uuid4().hex}"
    ignore = ids_reserved(deployment.pa.ctx.keys)
    rc.set(key, b"x", px=300)
    with redis_unchanged(rc, ignore):
        # the expiry itself is the event: polled, Redis has no other
        wait_until(lambda: not rc.exists(key), 10, f"{key} expiring")
    rc.set(key, b"x", px=60_000)
    with pytest.raises(AssertionError, match=f"removed b'{key}'"), redis_unchanged(rc, ignore):
        rc.delete(key)
