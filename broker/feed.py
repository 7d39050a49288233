"""The event feed: one capped stream across all sessions (``Keys.events``) with every stage and
every outcome, for webhooks, metrics and ``top``. Each session's history stays the record; the
feed is written with plain XADDs queued on the same pipeline as the script that made the change
(the same round trip), never from inside it, since the feed lives on another Cluster slot. A
stage's batch writes its entries with one ``feed.lua`` call instead (``producers/staging.py``).

So an outcome is published together with its finalize/readd, before Redis has said whether the
lease still held. The rare outcome refused as late (its lease had expired) is followed by a
``late-refused`` entry for the same id: a reader that counts outcomes subtracts it."""

from __future__ import annotations

import time
from typing import Any

from pending_actions.broker.events import Event
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import Spec

MAXLEN = 100_000


def publish(pipe: Any, keys: Keys, event: Event, spec: Spec | None = None,
            **fields: str | int | float | None) -> None:
    """Queue one feed entry on ``pipe`` (a pipeline or a client). Without a spec, ``fields``
    must name at least the session and the id."""
    entry: list[Any] = ["event", event.value, "at", f"{time.time():.3f}"]
    if spec is not None:
        entry += ["session", spec.session, "tenant", spec.tenant, "id", spec.id, "tool",
                  spec.tool, "kind", spec.kind, "created_at", f"{spec.created_at:.3f}"]
    for name, value in fields.items():
        if value not in ("", None):
            entry += [name, value]
    # XADD as is, not redis-py's xadd(): a stage queues one per action
    pipe.execute_command("XADD", keys.events, "MAXLEN", "~", MAXLEN, "*", *entry)
