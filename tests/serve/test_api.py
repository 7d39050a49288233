"""The HTTP API against the real server process, a real Redis and a real worker: every status
code, tenant isolation both ways, revocation, batch resolve fenced by id, ``by`` in the history,
and no plaintext token anywhere in Redis."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pending_actions.broker.errors import Forbidden
from pending_actions.broker.keys import Keys
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.serve.conftest import Server, free_port
from tests.support.procs import worker_env
from tests.support.runs import runs
from tests.support.waits import wait_until


def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def new_session() -> str:
    return f"web-{uuid.uuid4().hex[:10]}"


def stage(pa: PendingActions, session: str, owner: str, label: str = "edit a.py",
          apply: str = "t.ok", **kw: Any) -> str:
    return pa.stage(session=session, tool="edit", label=label, apply=apply, tenant=owner, **kw)


def test_status_codes(server: Server, pa: PendingActions, tokens: Tokens) -> None:
    t = tenant()
    approver, _ = tokens.create(t, "approver")
    producer, _ = tokens.create(t, "producer")
    s = new_session()
    first = stage(pa, s, t)
    http = server.http
    assert http.get("/healthz").json() == {"ok": True}
    # 401: no token, a malformed header, an unknown token
    for headers in ({}, {"authorization": "Basic abc"},
                    {"authorization": "Bearer pat_nope"}):
        r = http.get("/v1/inbox", headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer"
    # 403: a producer may not resolve, an approver may not stage, only admin reads /metrics
    r = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(producer),
                  json={"action": "apply", "reason": "x"})
    assert r.status_code == 403 and "approver" in r.json()["error"]
    r = http.post(f"/v1/sessions/{s}/actions", headers=server.as_(approver),
                  json={"tool": "edit", "label": "l", "apply": "t.ok"})
    assert r.status_code == 403
    assert http.get("/metrics", headers=server.as_(approver)).status_code == 403
    # 404: a session that does not exist; an id that is not a session id at all
    assert http.get(f"/v1/sessions/{new_session()}/pending",
                    headers=server.as_(approver)).status_code == 404
    assert http.get("/v1/sessions/a%20b/pending", headers=server.as_(approver)).status_code == 404
    # 400: bad input names the field, and nothing changed
    r = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(approver),
                  json={"action": "deploy", "reason": "x"})
    assert r.status_code == 400 and r.json()["field"] == "action"
    r = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(approver),
                  json={"action": "apply", "reason": "x", "colour": "red"})
    assert r.status_code == 400 and r.json()["field"] == "colour"
    r = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(approver), content=b"{")
    assert r.status_code == 400 and r.json()["field"] == "body"
    assert [a.id for a in pa.pending(s)] == [first]
    # 201: a producer stages into its tenant's session
    r = http.post(f"/v1/sessions/{s}/actions", headers=server.as_(producer),
                  json={"tool": "edit", "label": "second", "apply": "t.ok",
                        "payload": {"n": 2}})
    assert r.status_code == 201
    second = r.json()["id"]
    # 409: approving what is no longer the target changes nothing
    r = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(approver),
                  json={"action": "apply", "reason": "late click", "expect_id": first})
    assert r.status_code == 409 and r.json()["is_error"] and "expect_id" in \
        r.json()["content"][0]["text"]
    assert [a.id for a in pa.pending(s)] == [second, first]
    # 200: the result shape of resolve
    r = http.post(f"/v1/sessions/{s}/resolve", headers=server.as_(approver),
                  json={"action": "apply", "reason": "ok", "expect_id": second})
    assert r.status_code == 200
    assert r.json()["content"] == [{"type": "text", "text": f"applied {second}"}]
    assert r.json()["details"]["label"] == "second"
    assert [a.id for a in pa.pending(s)] == [first]


def test_tenants_are_isolated_both_ways(server: Server, pa: PendingActions,
                                        tokens: Tokens) -> None:
    a, b = tenant(), tenant()
    tok_a, _ = tokens.create(a, "approver")
    tok_b, _ = tokens.create(b, "admin")  # admin: every role, still one tenant
    sa, sb = new_session(), new_session()
    id_a, id_b = stage(pa, sa, a), stage(pa, sb, b)
    http = server.http
    for token, mine, theirs, my_id, their_id in ((tok_a, sa, sb, id_a, id_b),
                                                  (tok_b, sb, sa, id_b, id_a)):
        inbox = http.get("/v1/inbox", headers=server.as_(token)).json()
        ids = [x["id"] for x in inbox["actions"]]
        assert my_id in ids and their_id not in ids
        assert http.get(f"/v1/sessions/{mine}/pending", headers=server.as_(token)) \
            .status_code == 200
        r = http.get(f"/v1/sessions/{theirs}/pending", headers=server.as_(token))
        assert r.status_code == 404 and r.json() == {"error": "no such session"}
        r = http.post(f"/v1/sessions/{theirs}/resolve", headers=server.as_(token),
                      json={"action": "apply", "reason": "not mine"})
        assert r.status_code == 404
        r = http.post("/v1/resolve-batch", headers=server.as_(token),
                      json=[{"session": theirs, "id": their_id, "action": "discard",
                             "reason": "not mine"}])
        assert r.status_code == 200 and r.json()["results"][0]["status"] == 404
    # staging into another tenant's session is refused too, and looks like "no such session"
    r = http.post(f"/v1/sessions/{sa}/actions", headers=server.as_(tok_b),
                  json={"tool": "edit", "label": "sneak", "apply": "t.ok"})
    assert r.status_code == 404
    with pytest.raises(Forbidden):
        stage(pa, sa, b)
    assert [x.id for x in pa.pending(sa)] == [id_a]
    assert [x.id for x in pa.pending(sb)] == [id_b]
    assert runs(pa.client, sa) == [] and runs(pa.client, sb) == []


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args], env=worker_env(url),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_token_cli_revocation_and_no_plaintext_in_redis(
        server: Server, pa: PendingActions, redis_server: Any) -> None:
    t, name = tenant(), f"alice-{uuid.uuid4().hex[:6]}"
    made = cli(redis_server.url, "token", "create", "--tenant", t, "--role", "approver",
               "--name", name)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert re.fullmatch(r"pat_[A-Za-z0-9_-]{40,}", token)
    # with an approver's token, a link that opens the inbox signed in: on stderr, after the
    # token itself on stdout, which stays the one line a script reads
    assert f"sign-in link (as secret as the token): http://127.0.0.1:8080/#token={token}\n" \
        in made.stderr, made.stderr
    assert cli(redis_server.url, "token", "create", "--tenant", t, "--role", "approver",
               "--name", name).returncode == 2  # the name is taken
    assert cli(redis_server.url, "token", "create", "--tenant", t, "--role", "root") \
        .returncode == 2
    assert server.http.get("/v1/inbox", headers=server.as_(token)).status_code == 200
    assert_nowhere_in_redis(pa.client, token)
    listed = cli(redis_server.url, "--json", "token", "ls")
    assert name in listed.stdout and token not in listed.stdout
    assert cli(redis_server.url, "token", "revoke", name).returncode == 0
    r = server.http.get("/v1/inbox", headers=server.as_(token))
    assert r.status_code == 401 and r.json()["error"] == "invalid or revoked token"
    assert cli(redis_server.url, "token", "revoke", name).returncode == 1


def test_token_cli_links_for_people_only(redis_server: Any, tokens: Tokens) -> None:
    """``--inbox-url`` (or its variable) sets where the link goes; a producer's token, a
    program's, gets none; an address the fragment cannot follow is refused, no token made."""
    t = tenant()

    def made(*args: str, **env: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "pending_actions", "--json", "token", "create", "--tenant", t,
             *args], env={**worker_env(redis_server.url), **env}, cwd=ROOT,
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return dict(orjson.loads(done.stdout))

    admin = made("--role", "admin", "--inbox-url", "https://inbox.example/pa/")
    assert admin["link"] == f"https://inbox.example/pa/#token={admin['token']}"
    approver = made("--role", "approver", PENDING_ACTIONS_INBOX_URL="http://10.0.0.5:9000/")
    assert approver["link"] == f"http://10.0.0.5:9000/#token={approver['token']}"
    assert "link" not in made("--role", "producer")
    before = {p.name for p in tokens.all()}
    for bad in ("ftp://inbox.example/", "inbox.example", "http://inbox.example/#x"):
        refused = cli(redis_server.url, "token", "create", "--tenant", t, "--role", "approver",
                      "--inbox-url", bad)
        assert refused.returncode == 2 and "--inbox-url" in refused.stderr, refused.stderr
    refused = subprocess.run(  # the variable, read by the one settings class, alike
        [sys.executable, "-m", "pending_actions", "token", "create", "--tenant", t, "--role",
         "approver"], env={**worker_env(redis_server.url),
                           "PENDING_ACTIONS_INBOX_URL": "inbox.example"},
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "bad setting PENDING_ACTIONS_INBOX_URL: must be" in refused.stderr, refused.stderr
    assert {p.name for p in tokens.all()} == before


def test_first_token_made_on_the_first_start_only(redis_server: Any, tmp_path: Path) -> None:
    """``serve --first-token T`` (a compose deployment's way in): the first start prints an
    admin token of T once, which works; a restart makes none and says so; nor does one after
    that token's revocation, which would print a fresh admin token into the logs."""
    t, prefix = tenant(), f"first{uuid.uuid4().hex[:6]}"  # a deployment of its own
    rc: Any = redis.Redis.from_url(redis_server.url)
    names = Keys(prefix=prefix).token_names

    def start(n: int) -> tuple[str, str]:
        """A serve with --first-token, until it answers: what it said on stdout and stderr."""
        log = tmp_path / f"serve-{n}.log"
        server = Server(redis_server.url, log, {"key_prefix": prefix}, ("--first-token", t))
        server.wait_ready()
        assert server.proc.stdout is not None
        out = ""
        if n == 0:  # printed before the port opened
            out = server.proc.stdout.readline()
            token = out.rpartition(" ")[2].strip()
            link = server.proc.stdout.readline()
            assert link == ("sign-in link (as secret as the token): http://127.0.0.1:8080/"
                            f"#token={token}\n"), link
            assert server.http.get("/v1/inbox", headers=server.as_(token)).status_code == 200
            assert server.http.get("/metrics", headers=server.as_(token)).status_code == 200
        server.stop()
        return out, log.read_text()

    out, _err = start(0)
    said = re.fullmatch(rf"first admin token for tenant {t} \(shown once\): (pat_\S+)\n", out)
    assert said, out
    [name] = [n.decode() for n in rc.hkeys(names)]
    assert name.startswith(f"{t}-admin-")
    for n in (1, 2):
        out, err = start(n)
        assert out == "" and f"the first admin token was made before ({name})" in err, err
        assert [k.decode() for k in rc.hkeys(names)] == ([name] if n == 1 else [])
        if n == 1:
            made = subprocess.run(
                [sys.executable, "-m", "pending_actions", "token", "revoke", name],
                env=worker_env(redis_server.url, key_prefix=prefix), cwd=ROOT,
                capture_output=True, text=True, timeout=60)
            assert made.returncode == 0, made.stderr
    bad = cli(redis_server.url, "serve", "--port", str(free_port()), "--first-token", "no tenant!")
    assert bad.returncode == 2 and "tenant" in bad.stderr, bad.stderr


def assert_nowhere_in_redis(rc: redis.Redis, token: str) -> None:
    """Every key name and every value of every type: neither the token nor its secret part."""
    client: Any = rc  # replies of every type are read as bytes below
    needles = [token.encode(), token.removeprefix("pat_").encode()]
    seen = 0
    for key in client.scan_iter(count=500):
        seen += 1
        kind = client.type(key).decode()
        values: list[bytes] = [key]
        if kind == "string":
            values.append(client.get(key) or b"")
        elif kind == "hash":
            for f, v in client.hgetall(key).items():
                values += [f, v]
        elif kind == "list":
            values += client.lrange(key, 0, -1)
        elif kind == "set":
            values += list(client.smembers(key))
        elif kind == "zset":
            values += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            for _id, fields in client.xrange(key):
                for f, v in fields.items():
                    values += [f, v]
        for value in values:
            assert not any(n in value for n in needles), f"token found in {key!r}"
    assert seen > 10


def test_batch_resolve_with_one_stale_id(server: Server, pa: PendingActions,
                                         tokens: Tokens) -> None:
    t = tenant()
    token, who = tokens.create(t, "approver")
    s1, s2 = new_session(), new_session()
    old = stage(pa, s1, t, label="older")
    head = stage(pa, s1, t, label="newer")
    other = stage(pa, s2, t, label="other", reject="t.reject_text")
    items = [
        {"session": s1, "id": head, "action": "apply", "reason": "batch"},
        {"session": s1, "id": head, "action": "apply", "reason": "again: stale by now"},
        {"session": s2, "id": other, "action": "discard", "reason": "batch"},
        {"session": s1, "id": old, "action": "discard", "reason": "after the head went"},
    ]
    r = server.http.post("/v1/resolve-batch", headers=server.as_(token), json={"items": items})
    assert r.status_code == 200
    results = r.json()["results"]
    assert [x["status"] for x in results] == [200, 409, 200, 200]
    assert [x["id"] for x in results] == [head, head, other, old]
    assert results[0]["result"]["content"][0]["text"] == f"applied {head}"
    stale = results[1]["result"]
    assert stale["is_error"] and f"expect_id: {head}" in stale["content"][0]["text"]
    assert results[2]["result"]["content"][0]["text"] == "rejected other because batch"
    assert results[3]["result"]["content"][0]["text"] == "Discarded: older. Reason: after " \
        "the head went"
    assert pa.pending(s1) == [] and pa.pending(s2) == []
    assert [(x["handler"], x["id"]) for x in runs(pa.client, s1)] == [("t.ok", head)]
    assert [(x["handler"], x["id"]) for x in runs(pa.client, s2)] == [("t.reject_text", other)]
    # every resolve it made carries the approver's token name in the session's history
    history = pa.history(s1)
    decided = [e for e in history if e["event"] in ("taken", "applied", "discarded")]
    assert [(e["event"], e["id"], e.get("by")) for e in decided] == [
        ("taken", head, who.name), ("applied", head, who.name),
        ("taken", old, who.name), ("discarded", old, who.name)]


def test_inbox_newest_first_with_the_target_marked(server: Server, pa: PendingActions,
                                                  tokens: Tokens) -> None:
    t = tenant()
    token, _ = tokens.create(t, "approver")
    s1, s2 = new_session(), new_session()
    a = stage(pa, s1, t, label="a")
    b = stage(pa, s2, t, label="b", payload={"diff": "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n"})
    c = stage(pa, s1, t, label="c")
    body = server.http.get("/v1/inbox", headers=server.as_(token)).json()
    assert body["tenant"] == t
    got = [(x["id"], x["session"], x["target"]) for x in body["actions"]]
    assert got == [(c, s1, True), (b, s2, True), (a, s1, False)]
    assert all(x["age_s"] >= 0 for x in body["actions"])
    assert body["actions"][1]["payload"]["diff"].startswith("--- a")


def test_inbox_says_where_approvals_stand_for_whom(server: Server, pa: PendingActions,
                                                   tokens: Tokens) -> None:
    """``approval``: who approved (per verb), how many are missing, and whether the token's own
    person is among them; a discard that runs no reject handler needs no approval (None)."""
    t = tenant()
    pa.set_policy({"rules": [{"name": "two", "match": {"tool": "deploy"}, "decision": "ask",
                              "approvals": 2}]}, tenant=t)
    alice, who = tokens.create(t, "approver", name=f"Alice-{uuid.uuid4().hex[:4]}")
    bob, _ = tokens.create(t, "approver")
    s1, s2 = new_session(), new_session()
    plain = stage(pa, s1, t)  # no rule matches it: allowed, nobody's approval needed
    asked = pa.stage(session=s1, tool="deploy", label="Deploy", apply="t.ok", tenant=t)
    undo = pa.stage(session=s2, tool="deploy", label="Deploy", apply="t.ok",
                    reject="t.reject_text", tenant=t)
    r = server.http.post(f"/v1/sessions/{s1}/resolve", headers=server.as_(alice),
                         json={"action": "apply", "reason": "ok", "expect_id": asked})
    assert r.json()["content"][0]["text"].startswith("Approved 1 of 2"), r.text
    r = server.http.post(f"/v1/sessions/{s2}/resolve", headers=server.as_(alice),
                         json={"action": "discard", "reason": "no", "expect_id": undo})
    assert r.json()["content"][0]["text"].startswith("Approved 1 of 2"), r.text

    def seen(token: str) -> dict[str, Any]:
        body = server.http.get("/v1/inbox", headers=server.as_(token)).json()
        return {a["id"]: a["approval"] for a in body["actions"]}

    mine = {"by": [who.name], "missing": 1, "mine": True}
    none = {"by": [], "missing": 2, "mine": False}
    assert seen(alice) == {
        plain: None,
        asked: {"needed": 2, "apply": mine, "discard": None},
        undo: {"needed": 2, "apply": none, "discard": mine}}
    assert seen(bob)[asked] == {"needed": 2, "apply": {**mine, "mine": False},
                                "discard": None}


def test_metrics_show_a_tenant_its_own_series_only(server: Server, pa: PendingActions,
                                                   tokens: Tokens) -> None:
    t, other = tenant(), tenant()
    admin, _ = tokens.create(t, "admin")
    other_admin, _ = tokens.create(other, "admin")
    s, s2 = new_session(), new_session()
    stage(pa, s, t)
    stage(pa, s, t)
    stage(pa, s2, other)
    stage(pa, s2, other)
    for token, session in ((admin, s), (other_admin, s2)):
        r = server.http.post(f"/v1/sessions/{session}/resolve", headers=server.as_(token),
                             json={"action": "apply", "reason": "metrics"})
        assert r.status_code == 200
    # outcomes come from the event feed, read by a thread: wait for this one to show up
    wanted = f'pending_actions_outcomes_total{{kind="applied",tenant="{t}"}} 1.0'
    text = _eventually(lambda: server.http.get("/metrics", headers=server.as_(admin)).text,
                       wanted)
    assert f'pending_actions_pending{{tenant="{t}",tool="edit"}} 1.0' in text
    assert f'pending_actions_oldest_pending_age_seconds{{tenant="{t}"}}' in text
    assert 'pending_actions_resolve_seconds_count{action="apply",result="ok",' \
           f'tenant="{t}"}} 1.0' in text
    assert f'pending_actions_time_to_decision_seconds_count{{outcome="applied",tenant="{t}"}} ' \
           '1.0' in text
    for family in ("pending_actions_outcomes_total", "pending_actions_lease_stalls_total",
                   "pending_actions_in_flight", "pending_actions_dead_letters",
                   "pending_actions_redis_up 1.0"):
        assert family in text, family
    # no other tenant's label value at all, and none of the figures that add up every
    # tenant's work (sessions, queues, leases, worker loops)
    assert set(re.findall(r'tenant="([^"]*)"', text)) == {t}
    assert other not in text
    for family in ("pending_actions_sessions", "pending_actions_requests_waiting",
                   "pending_actions_tasks_queued", "pending_actions_leases",
                   "pending_actions_loops", "pending_actions_loop_idle_seconds"):
        assert f"\n{family} " not in text and f"\n{family}{{" not in text, family
        assert f"# TYPE {family} " not in text, family
    # the operator listener: every tenant and the deployment's figures, with no token
    wanted = f'pending_actions_outcomes_total{{kind="applied",tenant="{other}"}} 1.0'
    every = _eventually(lambda: server.operator.get("/metrics").text, wanted)
    assert f'pending_actions_pending{{tenant="{t}",tool="edit"}} 1.0' in every
    assert f'pending_actions_pending{{tenant="{other}",tool="edit"}} 1.0' in every
    for family in ("pending_actions_leases_overdue", "pending_actions_sessions ",
                   'pending_actions_loops{group="resolver",state="live"}',
                   "pending_actions_redis_up 1.0"):
        assert family in every, family
    # the operator's /metrics is only on its own listener: the API's still wants a token
    assert server.http.get("/metrics").status_code == 401


def _eventually(scrape: Callable[[], str], wanted: str, timeout: float = 10) -> str:
    scraped = [""]

    def found() -> str | None:
        scraped[0] = body = scrape()
        return body if wanted in body else None

    return wait_until(found, timeout, lambda: f"{wanted!r} in {scraped[0][-3000:]}",
                      interval_s=0.1)


def test_plain_json_stats(pa: PendingActions, redis_server: Any) -> None:
    out = cli(redis_server.url, "--json", "stats")
    assert out.returncode == 0
    data = orjson.loads(out.stdout)
    assert {"sessions", "pending", "in_flight", "dead", "tenants", "handlers"} <= set(data)


@pytest.mark.parametrize("which", ["--port", "--metrics-port"])
def test_a_port_in_use_is_one_line(redis_server: Any, which: str) -> None:
    """Both listeners are bound before either starts: a port in use (the API's or the
    operator's) is one line naming it, exit 2, never one listener up beside a traceback."""
    import socket

    from tests.serve.conftest import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        ports = {"--port": busy, "--metrics-port": str(free_port())} if which == "--port" \
            else {"--port": str(free_port()), "--metrics-port": busy}
        out = cli(redis_server.url, "serve", *[x for kv in ports.items() for x in kv])
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"error: cannot listen on 127.0.0.1:{busy}: Address already " \
        "in use", out.stderr


def test_a_person_edits_the_payload_over_http(server: Server, pa: PendingActions,
                                              tokens: Tokens) -> None:
    """``edit`` in a resolve's body: a JSON Merge Patch checked against the action's schema (a
    bad one is a 400 naming ``edit``, nothing changed); the handler sees the edited payload,
    the history keeps the staged one and the patch, ``by`` the token's name."""
    t = tenant()
    approver, who = tokens.create(t, "approver", name=f"carol-{uuid.uuid4().hex[:4]}")
    s = new_session()
    schema = {"type": "object", "properties": {"replicas": {"type": "integer", "maximum": 8}},
              "required": ["replicas"]}
    action_id = stage(pa, s, t, label="Scale", payload={"replicas": 2, "image": "api:1"},
                      schema=schema)
    url = f"/v1/sessions/{s}/resolve"
    bad = server.http.post(url, headers=server.as_(approver), json={
        "action": "apply", "reason": "more", "expect_id": action_id, "edit": {"replicas": 80}})
    assert bad.status_code == 400 and bad.json()["field"] == "edit", bad.text
    assert pa.pending(s)[0].payload == {"replicas": 2, "image": "api:1"}
    done = server.http.post(url, headers=server.as_(approver), json={
        "action": "apply", "reason": "more", "expect_id": action_id, "revision": 0,
        "edit": {"replicas": 4, "image": None}})
    assert done.status_code == 200 and not done.json()["is_error"], done.text
    assert done.json()["details"]["edit"] == {"replicas": 4, "image": None}
    [run] = runs(pa.client, s)
    assert run["id"] == action_id and run["payload"] == {"replicas": 4}
    [applied] = [e for e in pa.history(s) if e["event"] == "applied"]
    assert applied["by"] == who.name
    assert orjson.loads(applied["edit"]) == {"replicas": 4, "image": None}
