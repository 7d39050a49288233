"""The ``mcp:NAME`` apply handlers of a dramatiq process: ``worker --mcp-upstream NAME=...``
adds this module to the ones dramatiq imports, and it registers one handler per upstream of
the ``mcp_upstreams`` setting (the runner passes the options on in the environment).

Applying a staged call calls the upstream's tool with the action's payload (the model's
arguments, or a person's edit of them) and passes the handler's idempotency key and attempt in
the call's ``_meta`` (``KEY``, ``ATTEMPT``), so that an upstream that honours the key makes the
effect exactly once even when an attempt is run again after its worker was lost. The upstream's
result is the resolve's result; its error result raises ToolError with its text (the action
stays pending, same id); no result at all (it crashed, timed out, wrote garbage) is a failed
apply, ``Apply failed: <why>``.

One process of each upstream per dramatiq process, shared by all its worker threads: its
session runs on one event loop in a thread of its own, and takes the threads' calls at the same
time (JSON-RPC requests carry their own ids). One per thread would start as many copies of
every upstream as there are threads (eight Node processes for one filesystem server), and a
session on a thread's own loop (``workers/aio.py``) would go unread between that thread's
tasks. The process (and the loop's thread) is started on the first apply, never at import, and
again after it dies."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import mcp_types as types

from pending_actions.broker import failpoints
from pending_actions.broker.errors import ToolError
from pending_actions.broker.models import PendingAction
from pending_actions.broker.settings import Settings
from pending_actions.mcp.client import (
    STOP_S,
    Connection,
    UpstreamError,
    content_of,
    quiet_sdk_logs,
    text_of,
)
from pending_actions.mcp.upstreams import Upstream, configured
from pending_actions.workers.registry import handler

log = logging.getLogger("pending_actions.mcp")

# the names of the _meta entries an upstream reads (a prefix, as MCP's _meta keys take)
KEY = "pending-actions/idempotency-key"
ATTEMPT = "pending-actions/attempt"
ACTION = "pending-actions/action-id"
# where a fault test stops a worker: the upstream has answered, the outcome is not recorded
FAILPOINT = "mcp-after-call"


class Upstreams:
    """This process's upstreams, on their loop thread, started on first use."""

    def __init__(self, settings: Settings, found: dict[str, Upstream]) -> None:
        self.settings = settings
        self.found = found
        self.loop: asyncio.AbstractEventLoop | None = None
        self.connections: dict[str, Connection] = {}
        self.lock = threading.Lock()
        self.stop: asyncio.Event | None = None
        self.thread: threading.Thread | None = None

    def _started(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None:
                ready = threading.Event()
                self.thread = threading.Thread(target=asyncio.run, args=(self._main(ready),),
                                               name="mcp-upstreams", daemon=True)
                self.thread.start()
                ready.wait()
                atexit.register(self.close)
            if self.loop is None:
                raise UpstreamError("the MCP upstreams' event loop did not start")
            return self.loop

    async def _main(self, ready: threading.Event) -> None:
        self.stop = asyncio.Event()
        settings = self.settings
        try:
            async with contextlib.AsyncExitStack() as stack:
                for up in self.found.values():  # nothing starts yet: a process on first use
                    self.connections[up.name] = await stack.enter_async_context(
                        Connection(up, settings.mcp_start_timeout_s,
                                   settings.mcp_call_timeout_s,
                                   max_result_bytes=settings.mcp_max_result_bytes))
                self.loop = asyncio.get_running_loop()
                ready.set()
                await self.stop.wait()
        finally:
            ready.set()  # a loop that could not start: the callers are told, not left waiting

    def call(self, name: str, tool: str, arguments: dict[str, Any],
             meta: dict[str, Any]) -> types.CallToolResult:
        """From any thread: the upstream's result, or UpstreamError; never longer than a start
        and a call."""
        loop = self._started()
        future = asyncio.run_coroutine_threadsafe(
            self.connections[name].call(tool, arguments, meta), loop)
        bound = self.settings.mcp_start_timeout_s + STOP_S + self.settings.mcp_call_timeout_s + 5
        try:
            return future.result(timeout=bound)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise UpstreamError(f"MCP upstream {name} gave no answer to the call of {tool} "
                                f"within {bound:g}s") from None

    def close(self) -> None:
        """Stop every upstream process (at exit: dramatiq's clean shutdown)."""
        loop, stop = self.loop, self.stop
        if loop is None or stop is None or self.thread is None:
            return
        loop.call_soon_threadsafe(stop.set)
        self.thread.join(STOP_S + 2)


def apply_handler(upstreams: Upstreams, up: Upstream) -> Callable[..., dict[str, Any]]:
    def apply(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
              idempotency_key: str) -> dict[str, Any]:
        meta = {KEY: idempotency_key, ATTEMPT: action.attempts, ACTION: action.id}
        result = upstreams.call(up.name, action.tool, action.payload, meta)
        if failpoints.ARMED == FAILPOINT:
            from pending_actions.workers.actors import ctx  # the process's, already imported

            failpoints.hit(FAILPOINT, ctx.client, ctx.keys)
        if result.is_error:
            raise ToolError(text_of(result) or f"{action.tool} failed (the upstream said no "
                                               "more)")
        out: dict[str, Any] = {"content": content_of(result)}
        if result.structured_content is not None:
            out["details"] = {"structuredContent": result.structured_content}
        return out

    return apply


def register(settings: Settings) -> Upstreams:
    found = configured(settings)
    upstreams = Upstreams(settings, found)
    for up in found.values():
        handler(up.handler, settings.mcp_upstream_tenants.get(up.name))(
            apply_handler(upstreams, up))
    if found:
        log.info("MCP upstreams %s: handlers %s", ", ".join(found),
                 ", ".join(up.handler for up in found.values()))
    return upstreams


quiet_sdk_logs()
UPSTREAMS = register(Settings())
