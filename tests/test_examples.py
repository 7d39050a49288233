"""The Python examples of the README ("From Python") and of docs/python.md (up to its Handlers
section: a handler runs inside a worker, not on its own; its policies too) and the example
agent loop run as written, against a Redis of their own and a real worker with the example
handlers."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
