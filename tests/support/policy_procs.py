"""Processes of the policy races (tests/test_policy_races.py), run as
``python -m tests.support.policy_procs ...``:

The Redis URL comes from ``PENDING_ACTIONS_REDIS_URL``.

- ``approve SESSION NAME``: says it is ready, waits for the go (a list both sides share),
  then resolves SESSION as approver NAME and prints the result's JSON;
- ``stage TENANT PREFIX GROUP``: says it is ready (``test:ready:GROUP``), stages ``deploy``
  actions into sessions PREFIX-0..7 until ``test:stop:GROUP`` exists, then prints how many it
  staged and how many were denied."""

from __future__ import annotations

import os
import sys

from pending_actions.broker.connection import producer_client
from pending_actions.broker.errors import Denied
from pending_actions.producers import PendingActions


def approve(url: str, session: str, name: str) -> None:
    pa = PendingActions.from_url(url, resolve_timeout_s=30)
    rc = producer_client(url)
    pa.pending(session)  # connected and the scripts loaded before the go
    rc.rpush(f"test:ready:{session}", name)
    assert rc.blpop([f"test:go:{session}"], timeout=30) is not None
    result = pa.resolve(session=session, action="apply", reason="race", approver=name)
    print(result.to_json().decode())


def stage(url: str, tenant: str, prefix: str, group: str) -> None:
    pa = PendingActions.from_url(url)
    rc = producer_client(url)
    pa.pending(f"{prefix}-0")  # connected and the scripts loaded before it says ready
    rc.rpush(f"test:ready:{group}", prefix)
    staged = denied = n = 0
    while not rc.exists(f"test:stop:{group}"):
        try:
            pa.stage(session=f"{prefix}-{n % 8}", tool="deploy", label=f"D{n}", apply="t.ok",
                     tenant=tenant)
            staged += 1
        except Denied:
            denied += 1
        n += 1
    print(f"{staged} {denied}")


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    url = os.environ["PENDING_ACTIONS_REDIS_URL"]
    if command == "approve":
        approve(url, *args)
    else:
        stage(url, *args)
