"""Resolve latency through the HTTP API beside the Python client's, in one run against the same
Redis, worker and server: ``python -m tests.serve.latency [N]``.

Each round stages one action, then resolves it, alternating the two ways so that any drift of
the machine hits both alike; only the resolve is timed (HTTP: request to parsed response)."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.serve.conftest import Server
from tests.support.procs import Worker


def main(n: int = 300) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = EmbeddedRedis(directory=Path(tmp)).start()
        worker = Worker(redis_server.url, handlers="pending_actions.workers.examples").start()
        server = Server(redis_server.url).wait_ready()
        pa = PendingActions.from_url(redis_server.url)
        try:
            token, _ = Tokens(pa.client, pa.ctx.keys).create("bench", "approver")
            headers = server.as_(token)
            timings: dict[str, list[float]] = {"python": [], "http": []}
            for i in range(n + 20):  # the first 20 warm up connections and scripts
                session = f"lat-{uuid.uuid4().hex[:10]}"
                pa.stage(session=session, tool="edit", label="x", apply="examples.echo",
                         tenant="bench")
                way = "python" if i % 2 == 0 else "http"
                started = time.perf_counter()
                if way == "python":
                    result = pa.resolve(session=session, action="apply", reason="bench")
                    ok = not result.is_error
                else:
                    r = server.http.post(f"/v1/sessions/{session}/resolve", headers=headers,
                                         json={"action": "apply", "reason": "bench"})
                    ok = r.status_code == 200 and not r.json()["is_error"]
                elapsed = time.perf_counter() - started
                assert ok, f"{way} resolve failed"
                if i >= 20:
                    timings[way].append(elapsed * 1000)
            for way, ms in timings.items():
                q = statistics.quantiles(ms, n=10)
                print(f"{way:>6}: n={len(ms)} median {statistics.median(ms):.2f} ms  "
                      f"p10 {q[0]:.2f}  p90 {q[-1]:.2f}")
        finally:
            pa.close()
            server.stop()
            worker.stop()
            redis_server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
