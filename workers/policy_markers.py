"""The housekeeping chore that brings every partition's marker of a tenant's policy up to its
current version (``raise_markers``), which completes a ``policy set`` that stopped between
writing the version and raising the markers (docs/design.md, Policies)."""

from __future__ import annotations

import logging
from typing import Any

from pending_actions.broker.context import Context

log = logging.getLogger("pending_actions.resolver")


def raise_markers(ctx: Context) -> int:
    """Every partition's marker of every tenant's policy at least at the index's version (the
    version set last): one read of the index and of the markers, a mark_policy.lua call only
    where one is behind. Returns how many were raised."""
    k, client = ctx.keys, ctx.client
    index: Any = client.hgetall(k.policy_index)
    if not index:
        return 0
    current = {t.decode(): int(v) for t, v in index.items()}
    tenants = sorted(current)
    pipe = client.pipeline(transaction=False)
    for p in range(k.partitions):
        pipe.hmget(k.policy_markers(p), tenants)
    behind = [(p, t) for p, marks in enumerate(pipe.execute())
              for t, mark in zip(tenants, marks, strict=True)
              if int(mark or 0) < current[t]]
    if not behind:
        return 0
    pipe = client.pipeline(transaction=False)
    for p, t in behind:
        ctx.scripts.mark_policy(p, tenant=t, version=current[t]).on(pipe)
    raised = sum(1 for r in pipe.execute() if int(r))
    if raised:
        log.warning("raised %d partition marker(s) of policies to their current version (a "
                    "policy set stopped half way)", raised)
    return raised
