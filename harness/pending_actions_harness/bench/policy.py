"""Stage latency with a 50-rule policy against none, in the same run: a fresh Redis, one
client, the two tenants alternating in blocks (``ROUNDS`` rounds of ``N`` stages each), each
stage timed alone; prints each round's p50 and the median and range of the rounds.

``python -m pending_actions_harness.bench.policy [--fsync everysec|always] [--n 2000]``"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from pending_actions.broker.routing import heartbeat
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions

ROUNDS = 3


def fifty_rules() -> dict[str, Any]:
    """50 rules of the kinds a deployment writes: named tools, tool globs, payload paths,
    every decision; the action staged below matches a late allow rule, after every deny and
    ask rule that names its tool or a glob that admits it was looked at."""
    rules: list[dict[str, Any]] = []
    for i in range(20):  # other tools
        rules.append({"name": f"tool-{i}", "match": {"tool": f"tool_{i}"},
                      "decision": ("deny", "ask", "allow")[i % 3]})
    for i in range(10):  # globs that admit the staged tool, payloads that do not match
        rules.append({"name": f"glob-deny-{i}", "match": {
            "tool": "e*", "payload": {f"config.key{i}": f"prod-*{i}", "env": "prod"}},
            "decision": "deny", "reason": "no"})
    for i in range(10):
        rules.append({"name": f"glob-ask-{i}", "match": {
            "tool": "*", "label": f"*deploy {i}*", "payload": {"replicas": i + 10}},
            "decision": "ask", "approvals": 1 + i % 3})
    for i in range(9):
        rules.append({"name": f"path-{i}", "match": {"tool": "ed?t",
                                                     "payload": {f"items.{i}.name": "x*"}},
                      "decision": "allow", "auto": True})
    rules.append({"name": "edits", "match": {"tool": "edit"}, "decision": "allow"})
    return {"default": "ask", "rules": rules}


def p50(pa: PendingActions, tenant: str, n: int, payload: dict[str, Any]) -> float:
    took = []
    for i in range(n):
        started = time.perf_counter()
        pa.stage(session=f"{tenant}-{i % 50}", tool="edit", label="Fix a typo", apply="t.ok",
                 payload=payload, tenant=tenant)
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fsync", default="everysec", choices=["everysec", "always"])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = EmbeddedRedis(directory=Path(folder), fsync=args.fsync).start()
        try:
            rc = redis.Redis.from_url(server.url)
            pa = PendingActions.from_url(server.url)
            heartbeat(rc, pa.ctx.keys, "bench", ["t.ok"], "bench", 3_600_000)
            pa.set_policy(fifty_rules(), tenant="ruled")
            payload = {"path": "src/app.py", "config": {"key1": "dev"}, "replicas": 2,
                       "items": [{"name": "a"}, {"name": "b"}], "diff": "x" * 200}
            for tenant in ("plain", "ruled"):  # warm: ids, the policy read once, scripts
                p50(pa, tenant, 200, payload)
            plain: list[float] = []
            ruled: list[float] = []
            for r in range(ROUNDS):
                order = ("plain", "ruled") if r % 2 == 0 else ("ruled", "plain")
                for tenant in order:
                    (plain if tenant == "plain" else ruled).append(
                        p50(pa, tenant, args.n, payload))
                print(f"round {r + 1}: no policy {plain[-1]:.3f} ms, 50 rules {ruled[-1]:.3f} ms")
            ratios = [b / a for a, b in zip(plain, ruled, strict=True)]
            print(f"stage p50, fsync {args.fsync}, {ROUNDS} rounds of {args.n}: no policy "
                  f"{statistics.median(plain):.3f} ms ({min(plain):.3f}-{max(plain):.3f}), "
                  f"50 rules {statistics.median(ruled):.3f} ms ({min(ruled):.3f}-"
                  f"{max(ruled):.3f}); ratio {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f})")
            pa.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
