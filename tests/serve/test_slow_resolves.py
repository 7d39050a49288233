"""Slow handlers never hold up another tenant's reads (issue 29, item 15): one approver's batch
of 100 resolves, every handler blocked, is waiting in ``serve`` while another tenant's
``GET /v1/inbox`` answers within 2 s (it took 117 s when each resolve held one of the shared
thread pool's 40 threads)."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import redis

from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.serve.conftest import Server
from tests.support.runs import runs
from tests.support.waits import wait_until

ITEMS = 100
READ_BOUND_S = 2.0


def test_a_batch_of_slow_resolves_never_blocks_another_tenants_reads(
        server: Server, pa: PendingActions, rc: redis.Redis, tokens: Tokens) -> None:
    slow, other = f"slow-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    approver, _ = tokens.create(slow, "approver")
    reader, _ = tokens.create(other, "approver")
    gate = f"gate-{uuid.uuid4().hex[:8]}"
    sessions = [f"slow-{uuid.uuid4().hex[:10]}" for _ in range(ITEMS)]
    ids = pa.stage_many([{"session": s, "tool": "edit", "label": f"slow {n}", "apply": "t.gate",
                          "payload": {"gate": gate}, "tenant": slow}
                         for n, s in enumerate(sessions)])
    theirs = f"other-{uuid.uuid4().hex[:10]}"
    their_id = pa.stage(session=theirs, tool="edit", label="theirs", apply="t.ok",
                        tenant=other)
    items = [{"session": s, "id": i, "action": "apply", "reason": "batch"}
             for s, i in zip(sessions, ids, strict=True)]
    answered: list[httpx.Response] = []
    batch = threading.Thread(target=lambda: answered.append(server.http.post(
        "/v1/resolve-batch", headers=server.as_(approver), json={"items": items},
        timeout=120)))
    batch.start()
    try:
        # every resolve of the batch was sent and taken (its session's history says so): all
        # 100 are waiting in serve on handlers that cannot finish
        history = [pa.ctx.keys.history(s) for s in sessions]
        def all_taken() -> bool:
            pipe = rc.pipeline(transaction=False)
            for key in history:
                pipe.xlen(key)
            return all(n >= 2 for n in pipe.execute())

        wait_until(all_taken, 30, "the batch's resolves all taken", interval_s=0.1)
        assert not answered
        for _ in range(5):
            started = time.monotonic()
            inbox = server.http.get("/v1/inbox", headers=server.as_(reader))
            pending = server.http.get(f"/v1/sessions/{theirs}/pending",
                                      headers=server.as_(reader))
            took = time.monotonic() - started
            assert took < READ_BOUND_S, f"two reads took {took:.1f}s behind the batch"
            assert [a["id"] for a in inbox.json()["actions"]] == [their_id]
            assert [a["id"] for a in pending.json()["pending"]] == [their_id]
        assert not answered  # still waiting: the reads did not wait for it
    finally:
        rc.rpush(gate, *["open"] * ITEMS)
        batch.join(120)
    assert answered and answered[0].status_code == 200
    results = answered[0].json()["results"]
    assert [r["status"] for r in results] == [200] * ITEMS
    assert all(r["result"]["content"][0]["text"] == f"gated {i} done"
               for r, i in zip(results, ids, strict=True))
    assert all(len([x for x in runs(pa.client, s) if x["handler"] == "t.gate"]) == 1
               for s in sessions)
