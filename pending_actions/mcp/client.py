"""One upstream MCP server as we call it: its process, started over stdio by our transport
(``stdio``: what the SDK's ``stdio_client`` does, its stdout read through ``wire.Lines``, so
that an answer is never held past ``mcp_max_result_bytes``), and one client session on it,
started on first use and again after it dies. Every wait is bounded (the start by
``mcp_start_timeout_s``, a call by ``mcp_call_timeout_s``) and every failure is one line
(``UpstreamError``): a call never hangs on a server that exited, crashed mid-call, wrote
something that is not JSON-RPC or an answer past the cap.

The transport's messages pass through a relay of ours on their way to the session: it is what
tells, the moment it happens, that the process closed its stdout (it exited) or wrote a line
that does not parse, so that the next call starts a new process instead of being sent into a
dead one, and a call in flight fails at once with the reason."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TextIO, cast

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.session import ClientSession
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from pending_actions.broker.settings import Settings
from pending_actions.mcp.upstreams import Upstream
from pending_actions.mcp.wire import Line, Lines, Oversized, dumped, head

log = logging.getLogger("pending_actions.mcp")

# the whole of a stop: close its stdin, wait 2 s, SIGTERM its process group, wait 2 s,
# SIGKILL, wait for it to be reaped, then up to DRAIN_S for the rest of its stderr
STOP_S = 7.0
GRACE_S = 2.0
DRAIN_S = 0.5
# an upstream's stderr line longer than this is passed on in pieces (each with the prefix), so
# that one without a newline is never held whole
STDERR_LINE_MAX = 8192
# the error our transport answers a request with when the upstream's answer is over the cap:
# never sent on a wire (in JSON-RPC's range for implementations' own errors)
TOO_LARGE = -32_090
DEFAULT_MAX_RESULT_BYTES: int = Settings.model_fields["mcp_max_result_bytes"].default
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
                 errlog: TextIO | None = None,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> None:
        self.upstream = upstream
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.max_result_bytes = max_result_bytes
        # its stderr goes to ours (a worker's log, or the MCP client's log of the proxy), each
        # line led by "[mcp:NAME] ": never stdout
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
        try:
            async with stdio(self.upstream.argv, upstream_env(), self.errlog,
                             self.max_result_bytes, f"[mcp:{self.upstream.name}] ") as (read,
                                                                                     write):
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
        if isinstance(exc, MCPError) and exc.code == TOO_LARGE:
            return UpstreamError(f"{self._name()} answered {what} with more than "
                                 f"{self.max_result_bytes} bytes, the most read of an upstream "
                                 "(MCP_MAX_RESULT_BYTES): its answer was dropped unread")
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
        if isinstance(given, bytes):  # (our transport parses the bytes it read)
            given = given.decode("utf-8", "replace")
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


async def probe(upstream: Upstream, start_timeout_s: float, call_timeout_s: float,
                max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> list[types.Tool]:
    """Start ``upstream``, list its tools and stop it: what the operator is told at start."""
    async with Connection(upstream, start_timeout_s, call_timeout_s,
                          max_result_bytes=max_result_bytes) as up:
        return await up.tools()


# --- the transport ---------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def stdio(argv: Sequence[str], env: dict[str, str], errlog: TextIO, cap: int,
                prefix: str = ""
                ) -> AsyncIterator[tuple[MemoryObjectReceiveStream[SessionMessage | Exception],
                                         MemoryObjectSendStream[SessionMessage]]]:
    """The upstream's process and its messages, as the SDK's ``stdio_client`` gives them, but
    read through ``wire.Lines``: an answer over ``cap`` bytes is never held or parsed; the
    request it answers gets a ``TOO_LARGE`` error the moment the cap is passed, and the rest of
    that line is dropped as it comes, so the next answer is read as soon as the upstream
    writes it. (The SDK's reader holds a line whole and joins it again at every chunk: a
    50 MB answer took longer than the call's timeout, and the calls after it timed out behind
    it.) Its process is in a session of its own, stopped as a whole (``_stop``). Its stderr
    goes to ``errlog``, each line led by ``prefix`` (``_prefixed``)."""
    process = await anyio.open_process(list(argv), env=env, stderr=subprocess.PIPE,
                                       start_new_session=True)
    inbox_in, inbox = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbox, outbox_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        assert process.stdout is not None
        lines = Lines(cap)
        session_gone = False
        async with inbox_in:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError,
                                     anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    if session_gone:
                        continue  # drained, so that a process writing still can exit
                    for event in lines.feed(chunk):
                        item = _received(event, cap)
                        if item is None:
                            continue
                        try:
                            await inbox_in.send(item)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            session_gone = True
                            break

    async def write() -> None:
        assert process.stdin is not None
        async with outbox_out:
            try:
                async for message in outbox_out:
                    await process.stdin.send(dumped(message.message) + b"\n")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await inbox_in.aclose()  # it stopped reading: the session is told at once

    drained = anyio.Event()

    async def relay_stderr() -> None:
        assert process.stderr is not None
        try:
            await _prefixed(process.stderr, errlog, prefix)
        finally:
            drained.set()

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        group.start_soon(write)
        group.start_soon(relay_stderr)
        try:
            yield inbox, outbox
        finally:
            with anyio.CancelScope(shield=True):
                inbox.close()
                outbox.close()
                await _stop(process)
                # what it wrote last (why it exited, say) is read to its end, bounded: a
                # child of the upstream may hold the pipe open after the upstream exited
                with anyio.move_on_after(DRAIN_S):
                    await drained.wait()
            group.cancel_scope.cancel()


async def _prefixed(source: anyio.abc.ByteReceiveStream, errlog: TextIO, prefix: str) -> None:
    """An upstream's stderr into ``errlog``, each line led by ``prefix`` (``[mcp:NAME] ``):
    the worker's log and the proxy's stderr hold our lines too, and an upstream's would
    otherwise read as ours. A line is passed on once it is whole (or at STDERR_LINE_MAX, or
    when the stream ends); the write is done off the event loop, so a log that is slow to take
    it holds this task only, never a call."""
    held = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError,
                             anyio.BrokenResourceError, OSError):
        async for chunk in source:
            *lines, held = (held + chunk).split(b"\n")
            while len(held) >= STDERR_LINE_MAX:
                lines.append(held[:STDERR_LINE_MAX])
                held = held[STDERR_LINE_MAX:]
            if lines:
                await anyio.to_thread.run_sync(_write_lines, errlog, prefix, lines)
    if held:
        await anyio.to_thread.run_sync(_write_lines, errlog, prefix, [held])


def _write_lines(errlog: TextIO, prefix: str, lines: list[bytes]) -> None:
    text = "".join(prefix + line.rstrip(b"\r").decode("utf-8", "replace") + "\n"
                   for line in lines)
    with contextlib.suppress(OSError, ValueError):  # a log that is closed or gone: dropped
        errlog.write(text)
        errlog.flush()


def _received(event: Line | Oversized, cap: int) -> SessionMessage | Exception | None:
    """A line of the upstream as the session takes it: a message, or what did not parse (the
    relay ends the link on it); a line over the cap, the error answer to its request (or
    nothing, for a notification or a request of the upstream's: no call waits on it)."""
    if isinstance(event, Line):
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(event.data,
                                                                              by_name=False))
        except ValueError as exc:
            return exc
    found = head(event.head)
    if not found.is_response:
        log.warning("an MCP upstream's message over %d bytes was dropped unread (%s)", cap,
                    found.method or "not an answer with an id")
        return None
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=found.id, error=types.ErrorData(
        code=TOO_LARGE, message=f"an answer over {cap} bytes, dropped unread")))


async def _stop(process: anyio.abc.Process) -> None:
    """As MCP's lifecycle says: close its stdin, and what has not exited after a grace is
    terminated, its whole process group (an ``npx`` wrapper's children too); every wait
    bounded."""
    assert process.stdin is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, GRACE_S):
        await terminate_posix_process_tree(process, GRACE_S)
        await _exited(process, GRACE_S)
    with contextlib.suppress(OSError), anyio.move_on_after(GRACE_S):
        await process.aclose()


async def _exited(process: anyio.abc.Process, within_s: float) -> bool:
    # returncode, not wait(): asyncio's wait also waits for the pipes, which a child of the
    # upstream that inherited them may hold open after the upstream itself exited
    with anyio.move_on_after(within_s):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
