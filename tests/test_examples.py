"""The Python examples of the README ("From Python") and of docs/python.md (up to its Handlers
section: a handler runs inside a worker, not on its own; its policies too), the example agent
loop and the failed apply of docs/semantics.md (a shell transcript) run as written, against a
Redis of their own and a real worker with the example handlers."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from tests.support.procs import Worker, worker_env

README_URL = "redis://127.0.0.1:6399/0"


@pytest.fixture(scope="module")
def examples_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(directory=Path(tmp_path_factory.mktemp("redis-examples"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def examples_worker(examples_redis: EmbeddedRedis) -> Iterator[Worker]:
    w = Worker(examples_redis.url, handlers="pending_actions.workers.examples").start()
    yield w
    w.stop()


def python_blocks(page: Path, start: str, end: str) -> list[str]:
    text = page.read_text()
    section = text[text.index(start):text.index(end)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def example_blocks() -> list[str]:
    """The README's short example, then the longer ones of docs/python.md."""
    return [*python_blocks(ROOT / "README.md", "## From Python", "## From the command line"),
            *python_blocks(ROOT / "docs" / "python.md", "# The Python client", "## Handlers")]


def run_python(code: str, url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args] if not code else
                          [sys.executable, "-c", code.replace(README_URL, url)],
                          env=worker_env(url), cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_the_docs_show_the_async_client_and_the_file_edit() -> None:
    blocks = example_blocks()
    assert len(blocks) == 4, "each example below has its expected output"
    assert any("AsyncPendingActions" in b for b in blocks)
    assert any("propose_edit" in b and "Stale" in b for b in blocks)
    assert any("approver=" in b and "Denied" in b for b in blocks)


@pytest.mark.parametrize("index", range(4))
def test_example_runs_as_written(examples_redis: EmbeddedRedis, examples_worker: Worker,
                                 tmp_path: Path, index: int) -> None:
    code = example_blocks()[index]
    out = run_python(code, examples_redis.url, tmp_path)
    assert out.returncode == 0, out.stderr
    expected = [
        ["Accept: Fix typo", "reason: tests pass"],
        ["Applied Rename: approved"],
        ["--- a/notes.txt", "+hello world", "Wrote notes.txt (12 bytes) hello world",
         "Stale: notes.txt changed since the preview", "{'content': 'hello there\\n'} "
         "hello there"],
        ["never\nNeeds approval:\nApproved 1 of 2\nApplied Deploy: ok"],
    ][index]
    for needle in expected:
        assert needle in out.stdout, out.stdout
    if index == 2:
        # the stale apply wrote nothing; the edited one wrote what the person changed
        assert (tmp_path / "notes.txt").read_text() == "hello there\n"
        assert not list(tmp_path.glob(".notes.txt.*.tmp"))  # no temp file left behind


def test_agent_loop_example(examples_redis: EmbeddedRedis, examples_worker: Worker,
                            tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("helo world\n")
    out = run_python("", examples_redis.url, tmp_path, "-m",
                     "pending_actions.producers.agent_loop", str(notes))
    assert out.returncode == 0, out.stderr
    assert "<system-reminder>" in out.stdout
    assert "model: resolve (accepting: the typo is fixed)" in out.stdout
    assert "Accept: Edit notes.txt" in out.stdout
    assert notes.read_text() == "hello world\n"


def transcript(page: Path, heading: str) -> list[tuple[list[str], list[str]]]:
    """The first ``console`` block after ``heading``: each ``$ `` command as its arguments, with
    the lines it prints."""
    text = page.read_text()
    found = re.search(r"```console\n(.*?)```", text[text.index(heading):], re.S)
    assert found, f"no console block under {heading!r}"
    steps: list[tuple[list[str], list[str]]] = []
    for line in found.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:]), []))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_failed_apply_of_the_semantics_page_runs_as_written(
        examples_redis: EmbeddedRedis, examples_worker: Worker) -> None:
    """Issue 41, item 11: `examples.fail_once` refuses the first attempt and applies the
    second; every command prints what the page shows (the id's number aside) and exits as the
    page says, and the history holds the two attempts."""
    steps = transcript(ROOT / "docs" / "semantics.md", "### A failed apply, step by step")
    session = f"deploy-{uuid.uuid4().hex[:8]}"  # the page's deploy-1, once per run
    shown_id, real_id, codes = steps[0][1][0], "", []
    for argv, expected in steps:
        assert argv[0] == "pending-actions", argv
        args = [session if a == "deploy-1" else a for a in argv[1:]]
        out = subprocess.run([sys.executable, "-m", "pending_actions", *args],
                             env=worker_env(examples_redis.url), cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        real_id = real_id or out.stdout.strip()
        assert re.fullmatch(r"pending-action:deploy:\d+", real_id), out
        codes.append(out.returncode)
        assert out.stdout.splitlines() == [line.replace(shown_id, real_id) for line in expected], \
            (argv, out.stderr)
    assert codes == [0, 1, 0, 0, 0]
    history = subprocess.run([sys.executable, "-m", "pending_actions", "history", "--session",
                              session, "--json"], env=worker_env(examples_redis.url), cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert [(e["event"], e.get("attempt")) for e in orjson.loads(history.stdout)] == [
        ("staged", None), ("taken", "1"), ("failed", "1"), ("taken", "2"), ("applied", "2")]
