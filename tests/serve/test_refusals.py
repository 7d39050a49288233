"""Every route that takes a session, a token or a JSON body, tried as an adversary would
(issue 29): another tenant's session answers exactly as a missing one, a bad token, deep and
oversized input; each refusal is checked to have written nothing at all to Redis (every key
and value compared). The security headers of the page and the API."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from pending_actions.broker.payloads import MAX_DEPTH, max_body_bytes
from pending_actions.broker.settings import Settings
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.conftest import Deployment
from tests.serve.conftest import Server
from tests.support.unchanged import redis_unchanged

LIMITS = Settings()
BODY_LIMIT = max_body_bytes(LIMITS)
DEEP = 600


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def new_session() -> str:
    return f"adv-{uuid.uuid4().hex[:10]}"


class Party:
    """A tenant with a token of every role and a session with two pending actions."""

    def __init__(self, pa: PendingActions, tokens: Tokens) -> None:
        self.tenant = f"t-{uuid.uuid4().hex[:8]}"
        self.admin, _ = tokens.create(self.tenant, "admin")
        self.producer, _ = tokens.create(self.tenant, "producer")
        self.approver, _ = tokens.create(self.tenant, "approver")
        self.session = new_session()
        self.ids = [pa.stage(session=self.session, tool="edit", label=f"secret {n}",
                             apply="t.ok", payload={"secret": f"{self.tenant}-{n}"},
                             tenant=self.tenant) for n in range(2)]


@pytest.fixture
def victim(pa: PendingActions, tokens: Tokens) -> Party:
    return Party(pa, tokens)


@pytest.fixture
def attacker(pa: PendingActions, tokens: Tokens) -> Party:
    return Party(pa, tokens)


def requests(session: str, action_id: str) -> Iterator[tuple[str, str, Any]]:
    """(method, path, JSON body) of every route that names a session."""
    yield "GET", f"/v1/sessions/{session}/pending", None
    yield "POST", f"/v1/sessions/{session}/resolve", {"action": "apply", "reason": "mine now"}
    yield "POST", f"/v1/sessions/{session}/resolve", {"action": "discard", "reason": "gone",
                                                      "expect_id": action_id}
    yield "POST", "/v1/resolve-batch", {"items": [{"session": session, "id": action_id,
                                                   "action": "apply", "reason": "batch"}]}


def send(server: Server, token: str | None, method: str, path: str,
         body: Any = None) -> httpx.Response:
    return server.http.request(method, path, headers=server.as_(token),
                               json=body if body is not None else None)


def test_another_tenants_session_answers_as_a_missing_one(
        server: Server, single: Deployment, victim: Party, attacker: Party) -> None:
    missing = new_session()
    for method, path, body in requests(victim.session, victim.ids[-1]):
        with redis_unchanged(single.rc):
            theirs = send(server, attacker.admin, method, path, body)
        absent_path = path.replace(victim.session, missing)
        absent_body = orjson.loads(orjson.dumps(body).replace(victim.session.encode(),
                                                              missing.encode()))
        absent = send(server, attacker.admin, method, absent_path, absent_body)
        # the same status and body, but for the session's name where the answer echoes it
        echoed = orjson.loads(absent.content.replace(missing.encode(), victim.session.encode()))
        assert (theirs.status_code, theirs.json()) == (absent.status_code, echoed), path
        if path == "/v1/resolve-batch":
            assert theirs.status_code == 200
            item = theirs.json()["results"][0]
            assert (item["status"], item["error"]) == (404, "no such session")
        else:
            assert theirs.status_code == 404 and theirs.json() == {"error": "no such session"}
    # staging into it: the same 404, nothing written (not the tenant index, not the feed)
    with redis_unchanged(single.rc):
        r = send(server, attacker.producer, "POST", f"/v1/sessions/{victim.session}/actions",
                 {"tool": "edit", "label": "sneak", "apply": "t.ok"})
    assert r.status_code == 404 and r.json() == {"error": "no such session"}
    # and nothing of the victim's shows anywhere the attacker can look
    inbox = send(server, attacker.approver, "GET", "/v1/inbox").text
    metrics = send(server, attacker.admin, "GET", "/metrics").text
    for text in (inbox, metrics):
        assert victim.session not in text and victim.tenant not in text
    assert [a.id for a in single.pa.pending(victim.session)] == victim.ids[::-1]


@pytest.mark.parametrize("token", [None, "pat_not-a-token", "Basic", "revoked"])
def test_bad_tokens_write_nothing(server: Server, single: Deployment, tokens: Tokens,
                                  victim: Party, token: str | None) -> None:
    if token == "revoked":
        token, who = tokens.create(victim.tenant, "admin")
        tokens.revoke(who.name)
    routes = [*requests(victim.session, victim.ids[-1]), ("GET", "/v1/inbox", None),
              ("GET", "/metrics", None),
              ("POST", f"/v1/sessions/{victim.session}/actions",
               {"tool": "edit", "label": "l", "apply": "t.ok"})]
    for method, path, body in routes:
        headers = {"authorization": "Basic dXNlcjpwdw=="} if token == "Basic" else \
            server.as_(token)
        with redis_unchanged(single.rc):
            r = server.http.request(method, path, headers=headers, json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert set(r.json()) == {"error"}


def test_a_batch_item_needs_a_string_id_and_session(server: Server, single: Deployment,
                                                    victim: Party) -> None:
    """An item's id fences its resolve to that action: a null one is refused like any other
    non-id, not taken as "no id" (which would apply whatever is on top), and writes nothing."""
    good = {"session": victim.session, "id": victim.ids[0], "action": "apply", "reason": "r"}
    bad: list[tuple[str, dict[str, Any]]] = [
        ("id", {"id": None}), ("id", {"id": 123}), ("id", {"id": ""}), ("id", {"id": ["x"]}),
        ("id", {"id": "x" * 301}), ("session", {"session": None}),
        ("session", {"session": 123}), ("session", {"session": [victim.session]})]
    for field, change in bad:
        item = {**good, **change}
        with redis_unchanged(single.rc):
            r = send(server, victim.approver, "POST", "/v1/resolve-batch", {"items": [item]})
        assert r.status_code == 200, r.text
        assert r.json()["results"] == [{
            "session": item["session"], "id": item["id"], "status": 400,
            "error": r.json()["results"][0]["error"], "field": field}], change
    assert [a.id for a in single.pa.pending(victim.session)] == victim.ids[::-1]
    # beside a refused one, a good item still goes through: the head, named by its id
    head = {**good, "id": victim.ids[-1]}
    r = send(server, victim.approver, "POST", "/v1/resolve-batch",
             {"items": [{**good, "id": None}, head]})
    assert [x["status"] for x in r.json()["results"]] == [400, 200], r.text
    assert [a.id for a in single.pa.pending(victim.session)] == victim.ids[:1]


def bad_bodies(session: str, action_id: str) -> Iterator[tuple[str, str, Any, str]]:
    """(token role, path, body, the field the 400 must name) for deep and oversized input."""
    actions, resolve = f"/v1/sessions/{session}/actions", f"/v1/sessions/{session}/resolve"
    stage = {"tool": "edit", "label": "l", "apply": "t.ok"}
    big = "x" * (LIMITS.max_payload_bytes + 1)
    yield "producer", actions, {**stage, "payload": nested(DEEP)}, "payload"
    yield "producer", actions, {**stage, "payload": nested(MAX_DEPTH + 1)}, \
        "payload"
    yield "producer", actions, {**stage, "payload": {"blob": big}}, "payload"
    yield "approver", resolve, {"action": "apply", "reason": "r", "extra": nested(DEEP)}, \
        "extra"
    yield "approver", resolve, {"action": "apply", "reason": "r",
                                "extra": {"blob": "x" * LIMITS.max_extra_bytes}}, "extra"
    yield "approver", resolve, {"action": "apply", "reason": "r", "edit": nested(DEEP)}, "edit"
    yield "approver", "/v1/resolve-batch", {"items": [
        {"session": session, "id": action_id, "action": "apply", "reason": "r"},
        {"session": session, "id": action_id, "action": "apply", "reason": "r",
         "extra": nested(DEEP)}]}, "items.1.extra"
    yield "approver", "/v1/resolve-batch", [
        {"session": session, "id": action_id, "action": "apply", "reason": "r",
         "extra": nested(DEEP)}], "items.0.extra"


def test_deep_and_oversized_input_is_a_400_naming_the_field(
        server: Server, single: Deployment, victim: Party) -> None:
    for role, path, body, field in bad_bodies(victim.session, victim.ids[-1]):
        token = victim.producer if role == "producer" else victim.approver
        with redis_unchanged(single.rc):
            r = server.http.post(path, content=_dumps(body), headers={
                **server.as_(token), "content-type": "application/json"})
        assert r.status_code == 400, (path, field, r.text[:300])
        assert set(r.json()) == {"error", "field"} and r.json()["field"] == field, r.json()
    assert [a.id for a in single.pa.pending(victim.session)] == victim.ids[::-1]


def _dumps(value: Any) -> bytes:
    """JSON of any depth (orjson itself refuses past 254 levels)."""
    import json

    return json.dumps(value).encode()


def test_bodies_past_the_limits_are_refused_before_parsing(
        server: Server, single: Deployment, victim: Party) -> None:
    too_big = b'{"action": "apply", "reason": "' + b"x" * BODY_LIMIT + b'"}'
    too_deep = b'{"extra": ' + b'{"a": ' * 2000 + b"1" + b"}" * 2001  # past orjson's own 1024

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it is read
        for start in range(0, len(too_big), 65_536):
            yield too_big[start:start + 65_536]

    for path, token in ((f"/v1/sessions/{victim.session}/resolve", victim.approver),
                        ("/v1/resolve-batch", victim.approver),
                        (f"/v1/sessions/{victim.session}/actions", victim.producer)):
        headers = {**server.as_(token), "content-type": "application/json"}
        with redis_unchanged(single.rc):
            sized = server.http.post(path, headers=headers, content=too_big)
            streamed = server.http.post(path, headers=headers, content=chunked())
            deep = server.http.post(path, headers=headers, content=too_deep)
        for r in (sized, streamed):
            assert r.status_code == 413, (path, r.text[:200])
            assert r.json() == {"error": f"the body is over the limit of "
                                         f"{BODY_LIMIT} bytes", "field": "body"}
        assert deep.status_code == 400 and deep.json()["field"] == "body", deep.text


def test_security_headers_on_the_page_and_the_api(server: Server, victim: Party) -> None:
    for path, token in (("/", None), ("/static/inbox.js", None), ("/v1/inbox", None),
                        ("/v1/inbox", victim.approver), ("/healthz", None),
                        ("/nope", None)):
        r = server.http.get(path, headers=server.as_(token))
        csp = r.headers.get("content-security-policy", "")
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
    page = server.http.get("/").text
    assert "<script>" not in page and "<script src=\"/static/inbox.js\"></script>" in page
    assert " style=" not in page and "onclick" not in page


def test_the_unchanged_check_sees_every_kind_of_write(single: Deployment,
                                                      victim: Party) -> None:
    """The check above can fail: a stage, a token, one field of a hash each show up."""
    writes: list[Callable[[], object]] = [
        lambda: single.pa.stage(session=victim.session, tool="edit", label="l", apply="t.ok",
                                tenant=victim.tenant),
        lambda: Tokens(single.rc, single.pa.ctx.keys).create(victim.tenant, "approver"),
        lambda: single.rc.sadd(single.pa.ctx.keys.tenant_index(0, victim.tenant), "stray"),
    ]
    for write in writes:
        with pytest.raises(AssertionError, match="Redis changed"), \
                redis_unchanged(single.rc):
            write()


def test_an_unknown_route_or_method_is_one_json_answer(server: Server) -> None:
    """Every failure is JSON, starlette's own 404 and 405 too."""
    for method, path, status in (("GET", "/v1/nothing-here", 404),
                                 ("DELETE", "/v1/inbox", 405)):
        r = server.http.request(method, path)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-type"] == "application/json"
        assert set(r.json()) == {"error"} and path in r.json()["error"]
