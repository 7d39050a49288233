"""The repo's docker-compose.yml, unchanged, on a real Docker daemon: build, health, `serve`
(its first admin token read from its log, the API, the inbox page, both /metrics), a stage and
resolve from the host, a worker of the user's own handler package (the `handlers` profile),
three workers, one worker stopped and another's main process SIGKILLed (its restart policy
brings it back, healthy) under load, then the whole stack stopped and started, and a tally from
the history streams: nothing lost, nothing applied twice. Then docker-compose.bridge.yml over
it: the same service through published ports only.

Docker runs here as a private dockerd on the host's network (tests/compose_support.py), with
base images built from Debian's packages when no registry is reachable. Skipped only where
Docker cannot run (not root, or no docker/dockerd/debootstrap); under CI that is a failure."""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis

from pending_actions.broker.errors import PendingActionsError
from pending_actions.broker.keys import Keys
from pending_actions.broker.texts import NOTHING_TO_APPLY
from pending_actions.producers import PendingActions
from pending_actions_harness.soak import Histories
from tests.compose_support import Compose, Dockerd, free_port, unavailable
from tests.support.waits import wait_until

pytestmark = pytest.mark.slow

K = Keys()
TRANSIENT = (PendingActionsError, redis.ConnectionError, redis.TimeoutError,
             redis.BusyLoadingError)
# the compose workers keep 1000 history entries a session, and an action writes up to 6: a load
# session moves on to a new one (its name with a number) after this many actions
MAX_ACTIONS = 120
# each session stages at most 4 actions a second (at full speed the stops would be a small part
# of the load's time)
PACE_S = 0.25


@pytest.fixture(scope="module")
def daemon() -> Iterator[Dockerd]:
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the compose test: {reason}")
        pytest.skip(reason)
    d = Dockerd()
    started = time.monotonic()
    d.start()
    try:
        d.standins()
        print(f"\ndockerd and base images ready in {time.monotonic() - started:.1f}s")
        yield d
    finally:
        d.stop()


@pytest.fixture
def stack(daemon: Dockerd) -> Iterator[Compose]:
    compose = Compose(daemon, "pa-compose-test", free_port())
    compose.run("down", "-v", "--remove-orphans")  # what a run that died left behind
    ok = False
    try:
        started = time.monotonic()
        compose.run("build", timeout=1200)
        print(f"image built in {time.monotonic() - started:.1f}s")
        yield compose
        ok = True
    finally:
        if not ok:
            print(compose.logs())
        compose.run("down", "-v", "--remove-orphans")
        compose.docker("image", "prune", "-f")  # images of earlier sources, left untagged
        print(f"docker data root: {daemon.disk_usage() / 2**20:.0f} MiB")


class Load:
    """Agent sessions staging and resolving from the host until stopped, riding out a Redis
    that goes away: every stage() that returned an id is remembered, and every session used
    (``used``: a slow stop or restart must not leave the load without actions to stage)."""

    def __init__(self, pa: PendingActions, sessions: list[str]) -> None:
        self.pa, self.sessions = pa, sessions
        self.stop = threading.Event()
        self.done = 0  # resolves that applied or discarded
        self.changed = threading.Condition()
        self.acknowledged: set[str] = set()
        self.errors: list[BaseException] = []
        self.failures = Counter[str]()  # what the resolves that did not end an action said
        self.used: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._guarded, args=(s,)) for s in sessions]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _guarded(self, session: str) -> None:
        try:
            self._run(session)
        except BaseException as exc:
            self.errors.append(exc)

    def _run(self, base: str) -> None:
        rng, staged, session = random.Random(base), 0, base
        while not self.stop.is_set():
            if staged % MAX_ACTIONS == 0:
                session = f"{base}-{staged // MAX_ACTIONS}"
                with self.lock:
                    self.used.append(session)
            try:
                action_id = self.pa.stage(
                    session=session, tool="edit", label=f"edit {staged}", payload={"n": staged},
                    apply=rng.choice(["examples.echo", "examples.fail_once"]),
                    reject="examples.reject")
                staged += 1
                with self.lock:
                    self.acknowledged.add(action_id)
                res = self.pa.resolve(session=session, action=rng.choice(["apply", "discard"]),
                                      reason="load", timeout=10)
                if not res.is_error:
                    with self.changed:
                        self.done += 1
                        self.changed.notify_all()
                else:
                    with self.lock:
                        self.failures[res.text.split(": ", 1)[-1][:60]] += 1  # no label
            except TRANSIENT as exc:
                with self.lock:
                    self.failures[type(exc).__name__] += 1
            self.stop.wait(PACE_S)

    def wait(self, n: int, timeout: float = 120) -> None:
        """Wait for n more resolves from now, with every session still producing."""
        with self.changed:
            goal = self.done + n
            assert self.changed.wait_for(lambda: self.done >= goal, timeout), (
                f"{self.done} of {goal} resolves; {len(self.acknowledged)} staged; "
                f"failures {dict(self.failures)}; errors {self.errors}")
        assert not self.errors, self.errors
        assert all(t.is_alive() for t in self.threads), "a load session ended"


def drain(pa: PendingActions, rc: Any, session: str, timeout: float = 120) -> None:
    """Resolve until nothing is stacked or in flight (fail_once needs a second apply)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = pa.resolve(session=session, action="apply", reason="drain", timeout=15)
        if not res.is_error or res.text != NOTHING_TO_APPLY:
            continue
        if not rc.hlen(K.inflight(session)) and not rc.zcard(K.stack(session)):
            return
        tail = rc.xrevrange(K.history(session), count=1)  # in flight: await its next event
        rc.xread({K.history(session): tail[0][0] if tail else b"0-0"}, block=2000)
    raise AssertionError(f"{session} not drained")


def tally(rc: Any, sessions: list[str], acknowledged: set[str]) -> dict[str, int]:
    found = Histories.read(rc, sessions)
    staged, outcomes, pending = found.staged, found.outcomes, found.pending
    ended = set(outcomes) | pending
    return {"staged": len(staged), "acknowledged": len(acknowledged),
            "applied": sum(1 for o in outcomes.values() if o[0] == "applied"),
            "discarded": sum(1 for o in outcomes.values() if o[0] == "discarded"),
            "pending": len(pending), "dead": sum(rc.llen(K.dead(s)) for s in sessions),
            "lost": len((staged | acknowledged) - ended),
            "acknowledged_not_staged": len(acknowledged - staged),
            "ended_twice": sum(1 for o in outcomes.values() if len(o) > 1)}


# the worker containers' healthcheck, with --json: which worker it found
OWN_CHECK = ("sh", "-c",
             'pending-actions --json health --worker "@$PENDING_ACTIONS_WORKER_ID_FILE"')
FIRST_TOKEN = re.compile(r"first admin token for tenant default \(shown once\): (pat_\S+)")
SIGN_IN = re.compile(r"sign-in link \(as secret as the token\): (http://\S+)#token=(pat_\S+)")


def first_token(stack: Compose) -> str:
    """The admin token serve's first start printed, from its log (every start's), and its
    sign-in link to the page of the stack's own serve."""
    said = stack.run("logs", "--no-color", "serve", timeout=60)
    tokens = FIRST_TOKEN.findall(said)
    assert len(tokens) == 1, said[-2000:]
    links = SIGN_IN.findall(said)
    assert links == [(f"http://127.0.0.1:{stack.env['PA_SERVE_PORT']}/", tokens[0])], links
    return str(tokens[0])


def serves(stack: Compose, token: str, pa: PendingActions) -> None:
    """serve of the stack answers as a deployment needs: /healthz, the inbox page, an action
    staged from the host in the token's inbox and applied through the API by a worker, the
    tenant's /metrics with the token and every tenant's on the operators' port."""
    base = f"http://127.0.0.1:{stack.env['PA_SERVE_PORT']}"
    bearer = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as http:
        assert http.get("/healthz").json() == {"ok": True}
        page = http.get("/")
        assert page.status_code == 200 and "<html" in page.text.lower(), page.text[:200]
        assert http.get("/v1/inbox").status_code == 401  # no token, no inbox
        session = f"compose-inbox-{random.randrange(10**6)}"
        action_id = pa.stage(session=session, tool="edit", label="from the inbox",
                             apply="examples.echo")
        inbox = http.get("/v1/inbox", headers=bearer)
        assert inbox.status_code == 200, inbox.text
        assert action_id in {a["id"] for a in inbox.json()["actions"]}, inbox.text[:2000]
        done = http.post(f"/v1/sessions/{session}/resolve", headers=bearer,
                         json={"action": "apply", "reason": "approved in the inbox"})
        assert done.status_code == 200 and not done.json()["is_error"], done.text
        assert done.json()["content"][0]["text"] == "Applied from the inbox: approved in the inbox"
        metrics = http.get("/metrics", headers=bearer)
        assert metrics.status_code == 200 and "pending_actions_redis_up 1" in metrics.text
    operator = f"http://127.0.0.1:{stack.env['PA_METRICS_PORT']}/metrics"
    with httpx.Client(timeout=60, trust_env=False) as http:
        every = http.get(operator)  # no token: the operators' port
        assert every.status_code == 200 and "pending_actions_outcomes" in every.text


def test_compose_stack_scales_and_survives_stops(stack: Compose) -> None:
    # up: the producer starts only once the worker is healthy, which waits for Redis
    started = time.monotonic()
    stack.run("up", "-d")
    print(f"up in {time.monotonic() - started:.1f}s")
    (redis_c,), (worker_c,), (producer_c,), (serve_c,) = (
        stack.containers(s) for s in ("redis", "worker", "producer", "serve"))
    assert stack.health(redis_c) == "healthy"
    assert stack.health(worker_c) == "healthy"
    assert stack.state(producer_c, "Running") == "true"
    stack.wait_healthy([serve_c])  # nothing waits for it in `up`

    url = f"redis://127.0.0.1:{stack.env['PA_REDIS_PORT']}/0"
    rc: Any = redis.Redis.from_url(url)
    pa = PendingActions.from_url(url, resolve_timeout_s=30)
    assert rc.config_get("appendfsync") == {"appendfsync": "always"}
    assert rc.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}

    # stage and resolve from the host against the stack's Redis and worker
    action_id = pa.stage(session="compose-hello", tool="edit", label="hello",
                         apply="examples.echo", payload={"path": "a.py"})
    res = pa.resolve(session="compose-hello", action="apply", reason="from the host")
    assert not res.is_error and res.text == "Applied hello: from the host", res
    assert pa.pending("compose-hello") == []
    events = [e["event"] for e in pa.history("compose-hello") if e["id"] == action_id]
    assert events.count("staged") == events.count("applied") == 1, events
    started = time.monotonic()
    token = first_token(stack)
    serves(stack, token, pa)
    print(f"serve answered in {time.monotonic() - started:.1f}s")

    # three workers, and a worker of the user's own handler package (an image built FROM the
    # service image, examples/handler-image, run by the `handlers` profile), started together:
    # each is healthy, its resolve worker has joined, and its handler is staged and applied
    handlers = ("--profile", "handlers")
    started = time.monotonic()
    stack.run(*handlers, "build", "worker-handlers", timeout=1200)
    mark = (rc.xrevrange(K.workers, count=1) or [(b"0-0", {})])[0][0]
    stack.run(*handlers, "up", "-d", "--scale", "worker=3", "--no-recreate")
    workers = stack.running("worker")
    own = stack.run(*handlers, "ps", "-q", "worker-handlers").split()
    assert len(workers) == 3 and worker_c in workers and len(own) == 1
    stack.wait_healthy([*workers, *own])
    print(f"two more workers and one of the user's handlers healthy in "
          f"{time.monotonic() - started:.1f}s")
    joined = {f[b"name"] for _id, f in rc.xrange(K.workers, min=f"({mark.decode()}")
              if f.get(b"role") == b"resolver" and f.get(b"event") == b"ready"}
    assert len(joined) == 3, joined
    pa.stage(session="compose-own", tool="note", label="note", apply="acme.note",
             payload={"text": "hello from the host"})
    res = pa.resolve(session="compose-own", action="apply", reason="mine")
    assert not res.is_error and res.text == "Noted: hello from the host (mine)", res
    stack.run(*handlers, "rm", "-sf", "worker-handlers")

    sessions = [f"compose-{i}" for i in range(8)]
    with Load(pa, sessions) as load:
        load.wait(40)
        # one worker stopped under load: it lets its running handlers finish and exits 0
        victim = next(w for w in workers if w != worker_c)
        started = time.monotonic()
        stack.docker("stop", "-t", "40", victim, timeout=60)
        print(f"one worker stopped in {time.monotonic() - started:.1f}s, {load.done} resolves")
        assert stack.state(victim, "ExitCode") == "0"
        load.wait(40)

        # another worker's main process SIGKILLed from the host (a crash, the OOM killer): its
        # restart policy starts it again; its own check (the container's healthcheck) passes
        # for the new worker, not the killed one its id file named, and Docker, which set it
        # back to "starting" at the restart, says healthy
        got = stack.exec(worker_c, *OWN_CHECK)
        assert got.returncode == 0, got.stdout + got.stderr
        before = orjson.loads(got.stdout)["worker"]
        started = time.monotonic()
        stack.kill_and_await_restart(worker_c)
        assert int(stack.docker("inspect", "-f", "{{.RestartCount}}", worker_c)) >= 1
        seen: list[str] = []

        def new_worker_serving() -> bool:
            got = stack.exec(worker_c, *OWN_CHECK)  # fails while the container restarts
            seen[:] = [got.stdout + got.stderr]
            return got.returncode == 0 and orjson.loads(got.stdout)["worker"] != before

        wait_until(new_worker_serving, 60, lambda: f"the restarted worker healthy: {seen}",
                   interval_s=0.5)
        stack.wait_healthy([worker_c])
        print(f"a killed worker restarted and healthy in {time.monotonic() - started:.1f}s")
        load.wait(40)

        # the whole stack stopped under load; a container killed after the grace period
        # (the producer as PID 1 ignoring SIGTERM, say) would exit 137
        started = time.monotonic()
        stack.run("stop")
        stopped_in = time.monotonic() - started
        codes = {c[:12]: stack.state(c, "ExitCode")
                 for s in ("producer", "worker", "serve", "redis") for c in stack.containers(s)}
        assert set(codes.values()) == {"0"}, codes
        assert stack.state(producer_c, "ExitCode") == "0"
        print(f"whole stack stopped in {stopped_in:.1f}s")

        # back to count: Redis from its AOF, three workers, the producer
        stack.run("up", "-d", "--scale", "worker=3")
        workers = stack.running("worker")
        assert len(workers) == 3
        stack.wait_healthy([*stack.running("redis"), *workers, *stack.running("serve")])
        assert stack.running("producer")
        load.wait(40)
    assert not load.errors, load.errors
    # serve started again: no second first token; the first one still works (Redis's AOF)
    assert first_token(stack) == token
    assert "the first admin token was made before" in stack.run("logs", "--no-color", "serve")
    with httpx.Client(timeout=60, trust_env=False) as http:
        assert http.get(f"http://127.0.0.1:{stack.env['PA_SERVE_PORT']}/v1/inbox",
                        headers={"authorization": f"Bearer {token}"}).status_code == 200

    # the example producer's sessions are counted too, once it has stopped
    stack.run("stop", "producer")
    example = [k.decode().split("{")[1].split("}")[0]
               for k in rc.scan_iter(K.history("example-*"))]
    assert example, "the example producer staged nothing"
    assert len(load.used) >= len(sessions)
    for s in [*load.used, *example]:
        drain(pa, rc, s)
    counts = tally(rc, [*load.used, *example], load.acknowledged)
    print(counts, "\nresolves that ended nothing:", dict(load.failures))
    assert counts["acknowledged"] >= 60
    assert counts["lost"] == 0 and counts["ended_twice"] == 0, counts
    assert counts["acknowledged_not_staged"] == 0, counts
    assert counts["pending"] == 0 and counts["dead"] == 0, counts
    assert counts["applied"] + counts["discarded"] == counts["staged"], counts
    pa.close()
    rc.close()


def test_compose_bridge_variant(daemon: Dockerd) -> None:
    """docker-compose.bridge.yml over docker-compose.yml, for Docker without a host network:
    every service in the network of `net` on compose's bridge network, and the stack reached
    from the host through its published ports alone (Redis for a stage and a resolve, serve's
    API with its first token)."""
    compose = Compose(daemon, "pa-compose-bridge", free_port(), ("docker-compose.bridge.yml",))
    compose.run("down", "-v", "--remove-orphans")
    ok = False
    try:
        compose.run("build", timeout=1200)  # the layers of the test above, when it ran
        compose.run("up", "-d", "worker", "serve")  # and what they need: net, redis
        (net,), (worker,), (serve,) = (compose.containers(s) for s in ("net", "worker", "serve"))
        compose.wait_healthy([worker, serve])
        mode = "{{.HostConfig.NetworkMode}}"
        assert compose.docker("inspect", "-f", mode, net).strip() == "pa-compose-bridge_default"
        for c in (worker, serve, *compose.containers("redis")):
            assert compose.docker("inspect", "-f", mode, c).strip() == f"container:{net}"

        url = f"redis://127.0.0.1:{compose.env['PA_REDIS_PORT']}/0"
        pa = PendingActions.from_url(url, resolve_timeout_s=30)
        pa.stage(session="bridge", tool="edit", label="over the bridge", apply="examples.echo")
        res = pa.resolve(session="bridge", action="apply", reason="published")
        pa.close()
        assert not res.is_error and res.text == "Applied over the bridge: published", res
        base = f"http://127.0.0.1:{compose.env['PA_SERVE_PORT']}"
        with httpx.Client(base_url=base, timeout=60, trust_env=False) as http:
            got = http.get("/v1/inbox", headers={"authorization": f"Bearer {first_token(compose)}"})
            assert got.status_code == 200, got.text
        ok = True
    finally:
        if not ok:
            print(compose.logs())
        compose.run("down", "-v", "--remove-orphans")


def test_tally_sees_loss_and_duplicates(rc: redis.Redis, session: str) -> None:
    """The tally is only worth its zeros if it can count something: a staged id with no
    outcome is lost, one with two outcomes ended twice (histories written by hand)."""
    for event, action_id in [("staged", "a"), ("staged", "b"), ("applied", "a"),
                             ("discarded", "a")]:
        rc.xadd(K.history(session), {"event": event, "id": action_id})
    counts = tally(rc, [session], {"a", "b", "c"})
    assert counts["lost"] == 2 and counts["ended_twice"] == 1, counts
    assert counts["acknowledged_not_staged"] == 1, counts
