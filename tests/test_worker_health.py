"""``health --worker``, the check of one worker a container's healthcheck runs (issue 41 item
2): unhealthy before its id file exists, while its dramatiq process still imports its handlers,
while that process's pool is not registered, and once its dramatiq processes are killed until
their successor has loaded; healthy otherwise, whatever another worker of the deployment does.
Real workers and a real Redis; the id file as ``worker --id-file`` writes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import redis

from pending_actions.cli.health import worker_verdict
from pending_actions.procs import ROOT, children
from tests.support.faults import FAST, K, cluster
from tests.support.procs import Worker, worker_env
from tests.support.slow_import import RELEASE
from tests.support.waits import wait_until


def check(url: str, target: str, *flags: str) -> tuple[int, str]:
    """``health [FLAGS] --worker TARGET`` as a healthcheck runs it: exit code and output."""
    got = subprocess.run([sys.executable, "-m", "pending_actions", *flags, "health",
                          "--worker", target], env=worker_env(url), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert not got.stderr, got
    return got.returncode, got.stdout


def verdict(url: str, target: str) -> tuple[int, dict[str, Any]]:
    code, out = check(url, target, "--json")
    return code, orjson.loads(out)


def until(url: str, target: str, code: int, said: str, within: float = 30) -> dict[str, Any]:
    """Poll the check (a CLI: no event to await) until it exits ``code`` saying ``said``."""
    last: list[Any] = []

    def there() -> dict[str, Any] | None:
        last[:] = [verdict(url, target)]
        got, out = last[0]
        return out if got == code and said in (out["why"] or f"{out['worker']} healthy") \
            else None

    return wait_until(there, within, lambda: f"health --worker {code} {said!r}: {last}",
                      interval_s=0.3)


def test_one_worker_checked_alone_from_its_id_file(tmp_path: Path) -> None:
    id_file = tmp_path / "worker-id"
    target = f"@{id_file}"
    # leases of 15 s: a renewer beating every second is late on a busy machine, and lateness
    # is not what this test is about
    with cluster(tmp_path, workers=1, lease_ms="15000") as (server, (other,), pa):
        rc: Any = redis.Redis.from_url(server.url)
        code, line = check(server.url, target)
        assert code == 1 and line == f"unhealthy: no worker id file {id_file} yet (the worker " \
            "has not started)\n", line
        assert verdict(server.url, target) == (1, {"healthy": False, "worker": None,
                                                   "why": "no id file yet", "loops": []})

        # pool_ttl long: the registration heartbeat does not come back while the test
        # looks at a process whose pool it took out of the registry
        worker = Worker(server.url, "tests.support.slow_import",
                        overrides={**FAST, "lease_ms": "15000", "pool_ttl_ms": "600000"},
                        env={"PENDING_ACTIONS_WORKER_ID_FILE": str(id_file)}).launch()
        try:
            # the worker runs (its file written), its dramatiq process waits in its import
            out = until(server.url, target, 1, "no dramatiq process beating yet")
            name = id_file.read_text().strip()
            assert out["worker"] == name and name.split(":")[1] == str(worker.pid)

            rc.lpush(RELEASE, 1)
            out = until(server.url, target, 0, f"{name} healthy")
            code, line = check(server.url, target)
            assert code == 0 and line.startswith(f"worker {name} healthy: "), line
            procs = {r["process"] for r in out["loops"] if r["role"] == "dramatiq"}
            assert len(procs) == 1 and {r["supervisor"] for r in out["loops"]} == {None, name}
            # the process's one name: its beats' and its registry member's
            [proc] = procs
            members = [m.decode() for m in rc.zrange(K.pool_live, 0, -1)]
            assert [m for m in members if m.endswith(f"/{proc}")], (proc, members)
            staged = pa.stage(session="slow", tool="t", label="L", apply="t.slow")
            done = pa.resolve(session="slow", action="apply", reason="r", timeout=20)
            assert done.text == "slow handlers loaded" and pa.history("slow")[0]["id"] == staged

            # beating, its pool not registered: no stage of its handlers is routed to it
            [member] = [m for m in members if m.endswith(f"/{proc}")]
            expiry = rc.zscore(K.pool_live, member)
            assert expiry is not None
            rc.zrem(K.pool_live, member)
            why, _rows = worker_verdict(pa, name)
            assert why == f"worker {name}: handlers not registered by dramatiq process {proc}"
            rc.zadd(K.pool_live, {member: expiry})
            assert worker_verdict(pa, name)[0] is None

            # its dramatiq processes killed: `worker` starts them again, and the new one waits
            # in its import; the other worker stays healthy all along, which a deployment-wide
            # check (a stopped process anywhere) would not say
            others = {r["process"] for r in orjson.loads(subprocess.run(
                [sys.executable, "-m", "pending_actions", "--json", "health"],
                env=worker_env(server.url), cwd=ROOT, capture_output=True, text=True,
                timeout=60).stdout)["loops"] if r["role"] == "resolver"} - {name}
            [other_name] = [p for p in others if p.split(":")[1] == str(other.pid)]
            for pid in children(worker.pid):
                os.killpg(pid, signal.SIGKILL)  # dramatiq's main process and its group
            until(server.url, target, 1, f"dramatiq process {proc}: loop")
            code, line = check(server.url, other_name)
            assert code == 0, line
            code, line = check(server.url, target)
            assert code == 1 and line.startswith(f"unhealthy: dramatiq process {proc}: "), line
            rc.lpush(RELEASE, 1)
            out = until(server.url, target, 0, f"{name} healthy")
            assert {r["process"] for r in out["loops"] if r["role"] == "dramatiq"} != procs

            # a clean stop removes the file: the next check has no worker to look at
            assert worker.stop(30) == 0
            assert not id_file.exists()
            assert check(server.url, target)[0] == 1
        finally:
            worker.kill()
