"""Running ``async def`` handlers: one event loop per dramatiq worker thread, kept for the
thread's life.

Per thread rather than one loop per process: a dramatiq thread runs one task at a time and
dramatiq enforces time limits and shutdown by raising in that thread, so a thread that runs
its own loop to completion keeps both working unchanged, and a handler that blocks (a sync
call inside an ``async def``) holds up only its own task, never the other threads'. The loop
is kept between tasks so that clients a handler module creates lazily (an HTTP session, an
async Redis pool) can be reused by the next task on the same thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")
_local = threading.local()


def _coroutine(awaitable: Awaitable[T]) -> Any:
    async def wait() -> T:
        return await awaitable

    return wait()


def run(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` on this thread's loop and return its result or raise its error."""
    runner: asyncio.Runner | None = getattr(_local, "runner", None)
    if runner is None:
        runner = _local.runner = asyncio.Runner()
    try:
        return runner.run(_coroutine(awaitable))  # type: ignore[no-any-return]
    except Exception:
        raise
    except BaseException:
        # an interrupt raised into the thread (time limit, shutdown) may have left the loop
        # mid-step: start the next task on a fresh one
        _local.runner = None
        try:
            runner.close()
        finally:
            raise
