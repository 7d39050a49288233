"""What the framework adapters' tests share (tests/test_adapter_openai_agents.py,
tests/test_adapter_pydantic_ai.py, tests/test_adapter_langgraph.py and their support modules).

For the support modules, what their staged tools do: the notes file (JSON lines in a file named
by the tool's ``path`` argument, so every test counts its own side effects, each note with the
process that wrote it and the apply's idempotency key), the failure of ``flaky_note``, the gate
``gated_note`` waits at, and the "third process"'s barrier and answer. The staged tools stay in
each support module: a staged tool registers its handler under the module it is defined in,
which the workers import with ``--handlers``.

For the tests: a Redis and a worker of the suite's own, the CLI (``person``), the third process
that resumes a run (``third``, ``outcome``), a deployment a test kills its worker in, and small
polls and counts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pending_actions import AsyncPendingActions, NotPaused
from pending_actions.adapters.core import AgentRun, applying, label
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from tests.support.faults import FAST
from tests.support.procs import Worker, worker_env
from tests.support.waits import wait_until, wait_until_async

GATE_TIMEOUT_S = 60.0
CLI = str(Path(sys.executable).parent / "pending-actions")

# -- the support modules: what their staged tools do, and the third process


def notes(path: str | Path) -> list[dict[str, Any]]:
    """Every note written to ``path``, oldest first."""
    file = Path(path)
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def append_note(path: str, text: str) -> None:
    """Append a note: its text, this process, the idempotency key of the apply it is part of
    (None outside a worker)."""
    now = applying()
    line = {"text": text, "pid": os.getpid(), "key": now.idempotency_key if now else None}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def fail_once(path: str) -> None:
    """Raise the first time (the disk is full), leaving ``<path>.failed``; pass after that."""
    marker = Path(path + ".failed")
    if not marker.exists():
        marker.write_text("once")
        raise RuntimeError("the disk is full")


async def through_gate(path: str, text: str, gate: str) -> None:
    """Write the note once per action (keyed by the apply's idempotency key, so an attempt
    after a crash finds it written), say it started (``<path>.started``, this process's id),
    then wait for the test to create the file ``gate``."""
    now = applying()
    assert now is not None, "gated_note runs in a worker"
    if all(n["key"] != now.idempotency_key for n in notes(path)):
        append_note(path, text)
    with open(path + ".started", "a") as f:
        f.write(f"{os.getpid()}\n")
    async def opened() -> bool:  # the gate is a file: another process opens it
        return Path(gate).exists()

    await wait_until_async(opened, GATE_TIMEOUT_S, "the gate opening", interval_s=0.02)


def plan_of(content: object) -> dict[str, Any]:
    """The offline model's script, read from the user's message; each turn the model takes
    appends a line to the script's ``log`` (when given): its invocations, across processes."""
    plan: dict[str, Any] = json.loads(str(content))
    if plan.get("log"):
        with open(plan["log"], "a") as f:
            f.write(f"{os.getpid()}\n")
    return plan


def wait_to_go(barrier: list[str]) -> None:
    """With ``[READY, GO]``: create READY, then wait for GO to exist (so that two third
    processes resume at the same moment). With ``[]``: at once."""
    if not barrier:
        return
    ready, go = Path(barrier[0]), Path(barrier[1])
    ready.write_text(str(os.getpid()))
    wait_until(go.exists, GATE_TIMEOUT_S, "told to go", interval_s=0.002)


async def answer(resuming: Awaitable[Any],
                 shown: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """What a resume came to, as the third process prints it: its status, output (``shown``
    of it, when given and the run is done) and pending ids, or the NotPaused it raised."""
    try:
        got = await resuming
    except NotPaused as exc:
        return {"error": "NotPaused", "busy": exc.busy, "message": str(exc)}
    output = got.output if shown is None else shown(got.output) if got.status == "done" else None
    return {"status": got.status, "output": output, "pending": got.pending}


# -- the tests


def redis_and_worker(directory: Path, handlers: str) -> Iterator[str]:
    """A module fixture's body (``yield from``): a Redis of its own and a worker that imports
    the staged tools of ``handlers``; the Redis's URL."""
    server = EmbeddedRedis(directory=directory).start()
    worker = Worker(server.url, handlers=handlers, overrides=FAST).start()
    yield server.url
    worker.stop()
    server.stop()


def fresh(prefix: str, digits: int) -> str:
    """A session's or tenant's name of a test's own."""
    return f"{prefix}-{uuid.uuid4().hex[:digits]}"


def suite_fixtures(handlers: str, redis: str, prefix: str) -> tuple[Any, Any, Any]:
    """A suite's fixtures ``url``, ``session`` and ``tenant``: a Redis of the suite's own (its
    folder named ``redis``) with a worker that imports the staged tools of ``handlers``, and a
    session and a tenant (so that its policy is its own) of each test's own."""

    @pytest.fixture(scope="module", name="url")
    def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
        yield from redis_and_worker(tmp_path_factory.mktemp(redis), handlers)

    @pytest.fixture(name="session")
    def session() -> str:
        return fresh(prefix, 10)

    @pytest.fixture(name="tenant")
    def tenant() -> str:
        return fresh(prefix, 8)

    return url, session, tenant


def client(url: str) -> AsyncPendingActions:
    return AsyncPendingActions.from_url(url, resolve_timeout_s=30)


def resolve_args(session: str, action: str, reason: str, expect_id: str,
                 approver: str = "alice") -> list[str]:
    """The CLI's arguments for a person's resolve."""
    return ["resolve", "--session", session, "--action", action, "--reason", reason,
            "--approver", approver, "--expect-id", expect_id, "--timeout", "60"]


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``pending-actions ARGS`` in a process of its own: another person, another machine."""
    return subprocess.run([CLI, *args], env=worker_env(url), cwd=ROOT, capture_output=True,
                          text=True, timeout=90)


def person(url: str, session: str, action: str, reason: str, expect_id: str,
           approver: str = "alice") -> subprocess.CompletedProcess[str]:
    return cli(url, *resolve_args(session, action, reason, expect_id, approver))


def approve(url: str, session: str, action: str, reason: str, expect_id: str) -> None:
    """A person's resolve, which succeeds."""
    done = person(url, session, action, reason, expect_id)
    assert done.returncode == 0, done.stdout + done.stderr


def third(url: str, handlers: str, *argv: str) -> subprocess.Popen[str]:
    """A process that imports the support module ``handlers`` and runs its ``main`` with
    ``argv``: it resumes the session's run and prints what came of it."""
    code = f"import sys; from {handlers} import main; main(sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *argv], env=worker_env(url), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


async def pending(url: str, session: str) -> list[Any]:
    async with client(url) as pa:
        return await pa.pending(session)


async def events(url: str, session: str) -> list[dict[str, Any]]:
    async with client(url) as pa:
        return await pa.history(session)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def resumed_at_once(url: str, handlers: str, *argv: str,
                    ready: list[Path], go: Path) -> list[dict[str, Any]]:
    """Two (or more) third processes, one a ``ready`` file, that resume at the same moment
    (``argv`` and then the barrier): their answers, the done first, the NotPaused after."""
    procs = [third(url, handlers, *argv, str(r), str(go)) for r in ready]
    wait_until(lambda: all(r.exists() for r in ready), 30, "the resumes ready", interval_s=0.02)
    go.write_text("go")
    return sorted((outcome(p) for p in procs), key=lambda a: "error" in a)


@dataclass
class Deployment:
    """A deployment of a test's own, whose first worker the test kills: the Redis, that
    worker, and the worker that replaces it."""

    server: EmbeddedRedis
    handlers: str
    first: Worker
    second: Worker | None = None

    @property
    def url(self) -> str:
        return self.server.url


@contextmanager
def deployment(directory: Path, handlers: str, gate: Path) -> Iterator[Deployment]:
    """A Redis and a worker of the test's own; at the end the gate is opened (so no body waits
    on), the workers ended and the Redis stopped."""
    server = EmbeddedRedis(directory=directory).start()
    own = Deployment(server, handlers, Worker(server.url, handlers=handlers,
                                              overrides=FAST).start())
    try:
        yield own
    finally:
        gate.write_text("open")
        if own.second is not None:
            own.second.stop()
        own.first.kill()
        server.stop()


def killed_mid_apply(own: Deployment, session: str, action_id: str, file: Path) -> None:
    """A person approves the action; once its body (``gated_note``) has written the note and
    waits at its gate, the worker is SIGKILLed, the whole of it, its resolver too. A new
    worker's resolver finds the lease ended and ends the attempt with it: the resolve is told
    the apply was interrupted, and the action is pending again under the same id (section 4)."""
    started = Path(str(file) + ".started")
    resolving = subprocess.Popen([CLI, *resolve_args(session, "apply", "go", action_id)],
                                 env=worker_env(own.url), cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    wait_until(lambda: lines(started) == 1, 30, "the body started", interval_s=0.02)
    assert int(started.read_text().split()[0]) in own.first.tree()
    assert len(notes(file)) == 1  # written, not yet returned
    own.first.kill()  # SIGKILL, mid-apply
    own.second = Worker(own.url, handlers=own.handlers, overrides=FAST).start()
    out, err = resolving.communicate(timeout=90)
    assert resolving.returncode == 1 and "interrupted" in out, out + err
    [back] = asyncio.run(pending(own.url, session))
    assert (back.id, back.attempts) == (action_id, 1)  # pending again, the same id


def applied_past_the_gate(own: Deployment, session: str, action_id: str, file: Path,
                          gate: Path, reason: str = "go again") -> None:
    """The gate opened, a second approval applies the action with the same idempotency key:
    the body runs again and finds its note already written under that key."""
    started = Path(str(file) + ".started")
    gate.write_text("open")
    approve(own.url, session, "apply", reason, action_id)
    assert lines(started) == 2  # the body ran twice...
    [note] = notes(file)  # ...and wrote once: the second found its key written
    assert note["key"] == action_id


# -- what the suites check alike: each framework's test starts its run, the checks are these

Resumed = Callable[[], dict[str, Any]]
"""A third process's resume of the test's run, and what it printed."""

ASK: dict[str, Any] = {"default": "ask", "rules": []}
ALLOW: dict[str, Any] = {"default": "allow", "rules": []}
READ_ONLY: dict[str, Any] = {"default": "allow", "rules": [
    {"name": "read-only", "match": {"tool": "write_note"}, "decision": "deny",
     "reason": "notes are read-only today"}]}


async def pause_and_refuse_the_model(
        url: str, session: str, tenant: str,
        running: Callable[[AsyncPendingActions], Awaitable[AgentRun]],
) -> tuple[AgentRun, Any, Any]:
    """Under a policy that asks: the run ``running`` starts, the action it staged, and the
    model's own resolve of it (no approver)."""
    async with client(url) as pa:
        await pa.set_policy(ASK, tenant=tenant)
        paused = await running(pa)
        [action] = await pa.pending(session)
        refused = await pa.resolve(session=session, action="apply",
                                   reason="the model approves itself")
        return paused, action, refused


def asked_and_refused(url: str, session: str, paused: AgentRun, action: Any, refused: Any,
                      file: Path) -> None:
    """The run paused on the one call (``write_note``, text ``hello``) the policy asks about,
    under its label; the model's own resolve was refused; nothing is written yet."""
    assert (paused.status, paused.output, paused.pending) == ("paused", None, [action.id])
    assert paused.session == session
    assert action.tool == "write_note"
    assert action.label == label("write_note", action.payload)  # the name, the values
    assert action.label.startswith('write_note(path="') and 'text="hello"' in action.label
    assert action.reject is None
    assert action.policy is not None and action.policy["decision"] == "ask"
    assert refused.is_error and refused.text.startswith("Needs approval:"), refused.text
    assert [a.id for a in asyncio.run(pending(url, session))] == [action.id]
    assert notes(file) == []


def approved_applied_and_resumed(url: str, session: str, action_id: str, file: Path, log: Path,
                                 resumed: Resumed) -> None:
    """A person (alice) approves from the CLI, a worker applies it with the action's id as the
    idempotency key, and a third process resumes the run, which ends; resumed again, it is not
    paused any more."""
    approve(url, session, "apply", "fine by me", action_id)
    [note] = notes(file)
    assert note["text"] == "hello" and note["pid"] != os.getpid()  # a worker applied it
    assert note["key"] == action_id  # the idempotency key reached the body

    done = resumed()
    assert done == {"status": "done", "output": "model saw: noted 'hello'", "pending": []}
    assert len(notes(file)) == 1  # the approved call gave the worker's result: fn did not rerun
    assert lines(log) == 2  # the turn that called the tool, the turn that saw its result
    applied = [e for e in asyncio.run(events(url, session)) if e["event"] == "applied"]
    assert [e["id"] for e in applied] == [action_id]
    assert "alice" in json.dumps(applied[0])
    # the run is over: nothing to resume any more
    assert resumed()["error"] == "NotPaused"


def discarded(url: str, session: str, action_id: str, file: Path, args: dict[str, Any],
              resumed: Resumed) -> None:
    """A person discards the call (``write_note`` with ``args``); the resumed run's model sees
    the discard and its reason, and nothing is written."""
    approve(url, session, "discard", "not today", action_id)
    done = resumed()
    shown = label("write_note", args)
    assert done["status"] == "done"
    assert done["output"] == f"model saw: Discarded: {shown}. Reason: not today", done
    assert notes(file) == []


def denied(url: str, session: str, file: Path) -> None:
    """What a deny leaves: nothing pending, the deny in the history, nothing written."""
    assert asyncio.run(pending(url, session)) == []
    assert "denied" in [e["event"] for e in asyncio.run(events(url, session))]
    assert notes(file) == []


def ran_here(url: str, session: str, file: Path) -> None:
    """An allowed call ran at once in this process (no worker, no idempotency key)."""
    [note] = notes(file)
    assert note["pid"] == os.getpid() and note["key"] is None  # here, not in a worker
    assert asyncio.run(pending(url, session)) == []


def failed_then_applied(url: str, session: str, action_id: str, file: Path,
                        resumed: Resumed) -> None:
    """``flaky_note``'s first apply fails: the action stays pending under its id and the run
    paused; the second applies it and the resumed run sees its result."""
    failed = person(url, session, "apply", "go", action_id)
    assert failed.returncode == 1 and "the disk is full" in failed.stdout, failed.stdout
    [still] = asyncio.run(pending(url, session))
    assert still.id == action_id and still.attempts == 1
    again = resumed()
    assert again == {"status": "paused", "output": None, "pending": [action_id]}

    approve(url, session, "apply", "go again", action_id)
    done = resumed()
    assert done == {"status": "done", "output": "model saw: noted 'retry' at last",
                    "pending": []}
    assert len(notes(file)) == 1


def resumed_once_of_two(url: str, handlers: str, *argv: str, tmp_path: Path, file: Path,
                        log: Path) -> None:
    """Two third processes resume the approved run (a ``write_note`` of ``twice?``) at the
    same moment: one continues it, once; the other is told it is not paused."""
    go = tmp_path / "go"
    ready = [tmp_path / "ready-a", tmp_path / "ready-b"]
    answers = resumed_at_once(url, handlers, *argv, ready=ready, go=go)
    assert answers[0] == {"status": "done", "output": "model saw: noted 'twice?'",
                          "pending": []}
    assert answers[1]["error"] == "NotPaused", answers
    assert lines(log) == 2  # the model went on once
    assert len(notes(file)) == 1


def signed_off(url: str, session: str, action_id: str, file: Path, resumed: Resumed) -> None:
    """A person signs the ``signed_note`` off; the resumed run sees it written, once."""
    approve(url, session, "apply", "signed", action_id)
    done = resumed()
    assert done["output"] == "model saw: signed 'sign'"
    assert len(notes(file)) == 1


def resumes_nothing(url: str,
                    resuming: Callable[[AsyncPendingActions], Awaitable[Any]]) -> None:
    """``resuming`` a session with no paused run raises NotPaused."""
    async def body() -> None:
        async with client(url) as pa:
            await resuming(pa)

    with pytest.raises(NotPaused):
        asyncio.run(body())


def send(to: str, body: str, cc: list[str] | None = None) -> str:
    """Send a message.

    Args:
        to: who gets it
        body: what it says
        cc: who else
    """
    return "sent"
