"""The tests' one way to wait for something: ``wait_until(predicate, timeout_s, what)`` asks
until the predicate answers (anything true), with a deadline, and fails with an
AssertionError naming what was awaited. A sleep in a test paces a fault or lets time pass where
time is what is tested; a test that waits for an event waits here (docs/testing.md#waits).

``watching``: child processes the wait depends on; one that exits before the predicate answers
fails the wait at once with its exit status and what it wrote (``Watched``), rather than when
the deadline passes with nothing said."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import redis

from tests.support.replies import read

T = TypeVar("T")


@dataclass
class Watched:
    """A child process started with its stdout on a pipe and its stderr in a file (a pipe no one
    reads while the test waits could fill and stall the child)."""

    name: str
    proc: subprocess.Popen[str]
    stderr: IO[bytes] = field(repr=False)

    @classmethod
    def start(cls, name: str, argv: Sequence[str], **popen: Any) -> Watched:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=stderr, text=True,
                                **popen)
        return cls(name, proc, stderr)

    def said(self) -> str:
        """Its exit status, stdout and stderr (killed first if it still runs)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):  # (ValueError: read already)
            out = ""
        self.stderr.seek(0)
        err = self.stderr.read().decode(errors="replace")
        return (f"{self.name} (pid {self.proc.pid}) exited with {self.proc.returncode}\n"
                f"--- stdout ---\n{(out or '')[-4000:]}\n--- stderr ---\n{err[-4000:]}")

    def output(self, timeout_s: float) -> str:
        """Its stdout once it exits with 0; an AssertionError with all it said otherwise."""
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout_s} s:\n"
                                 f"{self.said()}") from None
        if self.proc.returncode != 0:
            self.stderr.seek(0)
            err = self.stderr.read().decode(errors="replace")
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n"
                                 f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.stderr):
            if pipe is not None:
                pipe.close()


def wait_until(predicate: Callable[[], T | None], timeout_s: float,
               what: str | Callable[[], str], *, interval_s: float = 0.05,
               watching: Sequence[Watched] = ()) -> T:
    """``predicate()`` until it answers something true, at most ``timeout_s``; returns the
    answer. A predicate that blocks itself (XREAD, BLPOP with a short timeout) takes
    ``interval_s=0``. ``what``: what is awaited, said in the failure (a callable is asked then,
    for the state at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for child in watching:
            if child.proc.poll() is not None:
                raise AssertionError(f"waiting for {_said(what)}: {child.said()}")
        answer = predicate()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            still = "".join(f"\n{child.said()}" for child in watching)
            raise AssertionError(f"{_said(what)}: not within {timeout_s} s{still}")
        if interval_s:
            time.sleep(min(interval_s, max(deadline - time.monotonic(), 0)))


async def wait_until_async(predicate: Callable[[], Awaitable[T | None]], timeout_s: float,
                           what: str | Callable[[], str], *, interval_s: float = 0.05) -> T:
    """``wait_until`` on an event loop: the predicate awaited, the loop free in between."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await predicate()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"{_said(what)}: not within {timeout_s} s")
        await asyncio.sleep(min(interval_s, max(deadline - time.monotonic(), 0)))


def _said(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


Fields = dict[bytes, bytes]


def next_entry(rc: redis.Redis, stream: str, match: Callable[[Fields], bool],
               since: bytes = b"0-0", block_ms: int = 500) -> Callable[[], Fields | None]:
    """A predicate for ``wait_until(..., interval_s=0)``: the next entry of ``stream`` after
    ``since`` that ``match`` accepts, each call blocking up to ``block_ms`` on XREAD."""
    cursor = [since]

    def look() -> Fields | None:
        for entry_id, fields in read(rc, stream, cursor[0], block_ms):
            cursor[0] = entry_id
            if match(fields):
                return fields
        return None

    return look


def history_event(rc: redis.Redis, stream: str, event: str, timeout_s: float,
                  since: bytes = b"0-0") -> dict[str, str]:
    """The next entry of a history stream whose ``event`` is ``event``, decoded."""
    fields = wait_until(next_entry(rc, stream, lambda f: f.get(b"event") == event.encode(),
                                   since), timeout_s, f"a {event} entry in {stream}",
                        interval_s=0)
    return {k.decode(): v.decode() for k, v in fields.items()}
