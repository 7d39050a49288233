"""One upstream MCP server as we call it: its process, started over stdio by the SDK's
``stdio_client``, and one client session on it, started on first use and again after it dies.
Every wait is bounded (the start by ``mcp_start_timeout_s``, a call by ``mcp_call_timeout_s``)
and every failure is one line (``UpstreamError``): a call never hangs on a server that exited,
crashed mid-call or wrote something that is not JSON-RPC.

The transport's messages pass through a relay of ours on their way to the session: it is what
tells, the moment it happens, that the process closed its stdout (it exited) or wrote a line
that does not parse, so that the next call starts a new process instead of being sent into a
dead one, and a call in flight fails at once with the reason."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TextIO, cast

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from pending_actions.mcp.upstreams import Upstream

# the whole of a stop: stdio_client closes stdin, waits 2 s, SIGTERMs, waits 2 s, SIGKILLs
STOP_S = 7.0
CLIENT_INFO = types.Implementation(name="pending-actions", version="0.1.0")


class UpstreamError(Exception):
    """An upstream did not start or did not answer a call: one line, for the operator at start
    and as the error text of a call."""


def upstream_env() -> dict[str, str]:
    """What an upstream's process gets: our environment (its own credentials, PATH, HOME)
    without ours: a Redis URL may carry a password, and an upstream is someone else's program."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PENDING_ACTIONS_", "dramatiq_"))}


@dataclass
class _Link:
    """One process of the upstream and the session on it."""

    session: ClientSession | None = None
    why: str | None = None  # why it ended (or never started): set once, when it does
    ready: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)

    def end(self, why: str) -> None:
        if self.why is None:
            self.why = why
        self.ready.set()
        self.ended.set()


class Connection:
    """An upstream, used as ``async with Connection(...) as up``: its calls may come from any
    task of the loop it was entered on, at the same time (a session takes concurrent
    requests)."""

    def __init__(self, upstream: Upstream, start_timeout_s: float, call_timeout_s: float,
                 errlog: TextIO | None = None) -> None:
        self.upstream = upstream
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        # its stderr is ours (a log, or the MCP client's log of the proxy); never stdout
        self.errlog = errlog or sys.__stderr__ or sys.stderr
        self._link: _Link | None = None
        self._lock = anyio.Lock()
        self._group: anyio.abc.TaskGroup | None = None
        self.starts = 0  # processes started, for logs and tests

    async def __aenter__(self) -> Self:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self._group is not None
        if self._link is not None:
            self._link.end("was stopped")
        # the stop is bounded (and shielded) inside stdio_client; this bounds the rest
        self._group.cancel_scope.deadline = anyio.current_time() + STOP_S + 1
        # not given the body's error: anyio would wrap it in an ExceptionGroup
        await self._group.__aexit__(None, None, None)

    def _name(self) -> str:
        return f"MCP upstream {self.upstream.name} (`{self.upstream.command}`)"

    # --- the process -----------------------------------------------------------------------
    async def _live(self) -> ClientSession:
        """The session, on a process started now if there is none or it ended."""
        async with self._lock:
            link = self._link
            if link is None or link.why is not None:
                assert self._group is not None, "use the connection as `async with`"
                link = self._link = _Link()
                self.starts += 1
                self._group.start_soon(self._hold, link)
                with anyio.move_on_after(self.start_timeout_s + STOP_S):
                    await link.ready.wait()
            if link.session is None:
                raise UpstreamError(f"{self._name()} did not start: {link.why or 'no answer'}")
            return link.session

    async def _hold(self, link: _Link) -> None:
        """Start the process, keep its session until the link ends, then stop it. Never
        raises: what went wrong is the link's ``why``."""
        params = StdioServerParameters(command=self.upstream.argv[0],
                                       args=list(self.upstream.argv[1:]), env=upstream_env())
        try:
            async with stdio_client(params, errlog=self.errlog) as (read, write):
                relayed, inbox = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                async with anyio.create_task_group() as group:
                    group.start_soon(self._relay, link, read, relayed)
                    async with ClientSession(inbox, write, client_info=CLIENT_INFO) as session:
                        await self._initialize(link, session)
                        await link.ended.wait()
                    group.cancel_scope.cancel()
        except Exception as exc:  # it could not be started (no such command, no permission)
            first = str(exc).strip().splitlines()
            link.end(f"cannot run its command ({first[0] if first else type(exc).__name__})")
        finally:
            link.end("was stopped")

    async def _initialize(self, link: _Link, session: ClientSession) -> None:
        try:
            with anyio.fail_after(self.start_timeout_s):
                await session.initialize()
        except TimeoutError:
            link.end(f"did not answer `initialize` within {self.start_timeout_s:g}s")
            return
        except (MCPError, ValidationError, RuntimeError) as exc:
            # its stdout closed (``why`` says so), or it answered with an error
            link.end(f"{link.why or 'failed'} before it answered `initialize`"
                     if isinstance(exc, MCPError) and link.why is not None
                     else f"refused `initialize`: {_one_line(exc)}")
            return
        link.session = session
        link.ready.set()

    async def _relay(self, link: _Link, source: AsyncIterable[SessionMessage | Exception],
                     sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """The transport's messages to the session, until the process closes its stdout or
        writes a line that is not JSON-RPC; then the session's stream is closed too, which
        fails every call in flight at once, and the link ends (the process is stopped)."""
        why = "exited (its stdout closed)"
        async with sink:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     anyio.EndOfStream):
                async for item in source:
                    if isinstance(item, Exception):
                        why = f"wrote a line that is not JSON-RPC on its stdout: {_line(item)}"
                        break
                    await sink.send(item)
            if link.why is None:
                link.why = why  # read by the calls that fail when the sink closes below
        link.end(why)

    # --- calls -----------------------------------------------------------------------------
    async def tools(self) -> list[types.Tool]:
        """Every tool the upstream lists (all pages)."""
        session = await self._live()
        found: list[types.Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self.call_timeout_s):
                while True:
                    params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    found.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        return found
        except (MCPError, TimeoutError, ValidationError) as exc:
            raise self._failure("tools/list", exc) from None

    async def call(self, tool: str, arguments: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> types.CallToolResult:
        """The upstream's result (an error result included); UpstreamError when it gave none."""
        session = await self._live()
        try:
            # the session's own timeout also tells the upstream the call is cancelled; ours
            # bounds what the session's does not (a write into a full pipe)
            with anyio.fail_after(self.call_timeout_s + 1):
                return await session.call_tool(
                    tool, arguments, read_timeout_seconds=self.call_timeout_s,
                    meta=cast(types.RequestParamsMeta, meta) if meta else None)
        except (MCPError, TimeoutError, ValidationError, RuntimeError) as exc:
            raise self._failure(f"the call of {tool}", exc) from None

    def _failure(self, what: str, exc: Exception) -> UpstreamError:
        link = self._link
        if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
            why = link.why if link is not None and link.why else "closed its connection"
            return UpstreamError(f"{self._name()} {why} during {what}")
        if isinstance(exc, TimeoutError) or (isinstance(exc, MCPError)
                                             and exc.code == types.REQUEST_TIMEOUT):
            return UpstreamError(f"{self._name()} did not answer {what} within "
                                 f"{self.call_timeout_s:g}s")
        if isinstance(exc, MCPError):
            return UpstreamError(f"{self._name()} refused {what}: {exc.message}")
        return UpstreamError(f"{self._name()} answered {what} with something that is not an "
                             f"MCP result ({_one_line(exc)})")


def _line(exc: Exception) -> str:
    """The line a transport could not parse, as far as its error says."""
    if isinstance(exc, ValidationError) and exc.errors():
        given = exc.errors()[0].get("input")
        if isinstance(given, str):
            return repr(given if len(given) <= 80 else given[:79] + "…")
    return f"({_one_line(exc)})"


def quiet_sdk_logs() -> None:
    """The SDK logs a traceback for every line an upstream writes that does not parse; the
    relay above says it in one line, with the upstream's name."""
    logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"


def text_of(result: types.CallToolResult) -> str:
    """A tool result's text: its text blocks, one per line."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def content_of(result: types.CallToolResult) -> list[dict[str, Any]]:
    """A tool result's content blocks as JSON objects (a resolve's result content)."""
    return [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in result.content]


async def probe(upstream: Upstream, start_timeout_s: float,
                call_timeout_s: float) -> list[types.Tool]:
    """Start ``upstream``, list its tools and stop it: what the operator is told at start."""
    async with Connection(upstream, start_timeout_s, call_timeout_s) as up:
        return await up.tools()
