"""An example producer: a few agent sessions that stage edits and resolve them, forever.
Run with ``python -m pending_actions.producers.example`` (docker-compose runs it beside a
worker)."""

from __future__ import annotations

import os
import random
import signal
import sys
import time

from pending_actions.broker.errors import RedisUnavailable, UnknownHandler
from pending_actions.producers.client import PendingActions
from pending_actions.producers.tool import render


def main() -> None:
    # as PID 1 of a container a signal without a handler is ignored: stop on `docker stop`
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    pa = PendingActions()
    sessions = [f"example-{i}" for i in range(int(os.environ.get("EXAMPLE_SESSIONS", "2")))]
    while True:
        session = random.choice(sessions)
        try:
            pa.stage(session=session, tool="edit", label=f"edit #{random.randint(1, 999)}",
                     apply=random.choice(["examples.echo", "examples.fail_once"]),
                     reject="examples.reject", payload={"path": "a.py"})
            action = random.choice(["apply", "apply", "discard"])
            print(render(pa.resolve(session=session, action=action, reason="example")),
                  flush=True)
        except (UnknownHandler, RedisUnavailable) as exc:
            print(f"waiting for the worker: {exc}", flush=True)
            time.sleep(2)  # a demo loop: retry slowly until a worker registers its handlers
        time.sleep(1)


if __name__ == "__main__":
    main()
