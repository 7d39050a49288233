"""The limits of what crosses an MCP wire, kept before anything is parsed: a message longer
than its cap is never held whole, and one nested deeper than our limit never reaches a parser.

Both ends need it. The SDK's stdio transports read a line whole before they parse it (its
client joins a long line's chunks again at every chunk, quadratic in the line's length), and
its parser gives up at about 200 levels of nesting with an error the SDK drops: a request it
cannot parse is never answered, so its caller waits for ever. Here a message is split into
lines from the raw bytes (``Lines``); a line over the cap is dropped as it arrives, its first
bytes kept to tell whose it was (``head``: its top-level ``id``, read without parsing the
rest), and the one that sent it is answered at once with the limit."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.to_thread
import mcp_types as types
import orjson
from mcp.shared.message import SessionMessage
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.payloads import MAX_DEPTH, max_body_bytes
from pending_actions.broker.settings import Settings
from pending_actions.mcp import texts

log = logging.getLogger("pending_actions.mcp")

# a tool call's arguments (and its _meta) sit two levels in: the message, its params
MESSAGE_DEPTH = MAX_DEPTH + 2
# what is kept of a line over its cap, to find its id in: a JSON-RPC message our peers write
# has its id in its first few dozen bytes (the SDKs write jsonrpc, id, then the rest)
HEAD_BYTES = 65_536
CHUNK = 65_536

_STRUCTURE = re.compile(rb'["{}\[\]:,]')
_STRING_REST = re.compile(rb'(?:[^"\\]|\\.)*"', re.S)  # from after an opening quote
_ID_NUMBER = re.compile(rb"\s*(-?\d+)\s*[,}]")
_KEYS = (b"id", b"method", b"result", b"error")


@dataclass(frozen=True)
class Head:
    """What a message says of itself at its top level, read without parsing it."""

    id: types.RequestId | None = None
    method: str | None = None
    keys: frozenset[bytes] = frozenset()  # which of _KEYS it has at its top level
    depth: int = 0  # the deepest nesting in what was read

    @property
    def is_response(self) -> bool:
        return self.id is not None and self.method is None and bool(
            self.keys & {b"result", b"error"})


def head(raw: bytes, whole: bool = False) -> Head:
    """The top-level id, method and keys of the JSON-RPC message ``raw`` (or of its first
    bytes), and how deep it nests. Reads structure only: strings are skipped by a regex, so a
    line of any size costs one pass in C plus a step per bracket. Without ``whole`` it stops
    once the id and what kind of message it is are known."""
    depth = deepest = 0
    at_key = False
    key: bytes | None = None
    ident: types.RequestId | None = None
    method: str | None = None
    keys: set[bytes] = set()
    pos = 0
    while (found := _STRUCTURE.search(raw, pos)) is not None:
        char = raw[found.start()]
        pos = found.end()
        if char == 0x22:  # a string: a key or a value
            end = _STRING_REST.match(raw, pos)
            if end is None:
                break  # cut off inside it
            if depth == 1:
                text = raw[pos:end.end() - 1]
                if at_key:
                    key = text if text in _KEYS else None
                    if key is not None:
                        keys.add(key)
                elif key == b"id" and ident is None:
                    ident = _string(text)
                elif key == b"method" and method is None:
                    method = _string(text)
            pos = end.end()
        elif char in b"{[":
            depth += 1
            deepest = max(deepest, depth)
            if depth == 1:
                at_key = char == 0x7B
        elif char in b"}]":
            depth -= 1
        elif depth == 1 and char == 0x3A:  # ':' a value follows its key
            at_key = False
            number = _ID_NUMBER.match(raw, pos) if key == b"id" else None
            if number is not None:
                ident = int(number.group(1))
        elif depth == 1 and char == 0x2C:  # ',' a key follows
            at_key = True
        if not whole and ident is not None and (method is not None
                                                 or keys & {b"result", b"error"}):
            break
    return Head(ident, method, frozenset(keys), deepest)


def _string(raw: bytes) -> str:
    try:
        text = orjson.loads(b'"' + raw + b'"')
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")
    return str(text)


def too_deep(line: bytes) -> Head | None:
    """The head of ``line`` if it nests deeper than ``MESSAGE_DEPTH``, else None. Counting its
    brackets first (in C) clears almost every line without a step in Python: one with fewer
    brackets than the limit cannot nest past it."""
    if line.count(b"{") + line.count(b"[") <= MESSAGE_DEPTH:
        return None
    found = head(line, whole=True)
    return found if found.depth > MESSAGE_DEPTH else None


# --- lines -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    data: bytes


@dataclass(frozen=True)
class Oversized:
    """A line that went past the cap: told once, when it does; the rest of it is dropped."""

    head: bytes


@dataclass
class Lines:
    """Newline-framed messages (stdio's framing: a message holds no raw newline) from chunks
    of bytes, none held past ``cap``: a line that goes past it is told as ``Oversized`` at once
    and skipped to its end without being kept."""

    cap: int
    _parts: list[bytes] = field(default_factory=list)
    _size: int = 0
    _skipping: bool = False

    def feed(self, chunk: bytes) -> list[Line | Oversized]:
        out: list[Line | Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not self._skipping:
                if self._size + len(piece) > self.cap:
                    out.append(Oversized(self._head(piece)))
                    self._parts, self._size, self._skipping = [], 0, True
                elif piece:
                    self._parts.append(piece)
                    self._size += len(piece)
            if end < 0:
                return out
            if not self._skipping:
                line = b"".join(self._parts).strip()
                if line:
                    out.append(Line(line))
            self._parts, self._size, self._skipping = [], 0, False
            start = end + 1

    def _head(self, piece: bytes) -> bytes:
        kept: list[bytes] = []
        size = 0
        for part in (*self._parts, piece):
            kept.append(part[:HEAD_BYTES - size])
            size += len(kept[-1])
            if size >= HEAD_BYTES:
                break
        return b"".join(kept)


# --- what our servers answer -----------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What a request to our servers may be: its size as sent (``max_body_bytes``, the same
    bound as a request body of ``serve``: room for arguments at ``MAX_PAYLOAD_BYTES`` and all
    else) and its depth."""

    request_bytes: int
    payload_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(max_body_bytes(settings), settings.max_payload_bytes)

    def over_size(self) -> str:
        return (f"the request is over {self.request_bytes} bytes, the most a request may "
                f"send (its arguments may be {self.payload_bytes} bytes as JSON)")


TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


def refusal(found: Head, why: str) -> types.JSONRPCResponse | types.JSONRPCError | None:
    """The answer to a request refused for ``why`` before it was parsed: a tool call gets the
    error result the server gives arguments past a limit (a model reads it as it reads any
    refused call); any other request a JSON-RPC error; a notification, or a line whose id
    could not be found, nothing (there is no one to answer)."""
    if found.id is None or found.is_response:
        log.warning("MCP: a message was dropped unread (%s): it names no request to answer", why)
        return None
    if found.method == "tools/call":
        text = texts.not_staged(str(InvalidInput("arguments", why)))
        result = types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                      is_error=True)
        return types.JSONRPCResponse(
            jsonrpc="2.0", id=found.id,
            result=result.model_dump(by_alias=True, mode="json", exclude_none=True))
    return types.JSONRPCError(jsonrpc="2.0", id=found.id, error=types.ErrorData(
        code=types.INVALID_REQUEST, message=f"Refused before it was read: {why}"))


def inbound(event: Line | Oversized,
            limits: Limits) -> tuple[bytes | None, types.JSONRPCResponse | types.JSONRPCError
                                     | None]:
    """One framed request to our server: (the line to parse, None) when it is within the
    limits, else (None, the answer to send instead, if it names anyone)."""
    if isinstance(event, Oversized):
        return None, refusal(head(event.head), limits.over_size())
    deep = too_deep(event.data)
    if deep is not None:
        return None, refusal(deep, TOO_DEEP)
    return event.data, None


def dumped(message: Any) -> bytes:
    return bytes(message.model_dump_json(by_alias=True, exclude_unset=True).encode())


# --- our servers' transports -----------------------------------------------------------------
class Sender(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...


class Stdin:
    """Our stdin as the SDK's ``stdio_server`` reads it (``stdin=``: an async iterator of
    lines), holding back every line past a limit: that line's request is answered here, on
    the server's write stream (``answer_on``), and the SDK never sees it."""

    def __init__(self, limits: Limits, fd: int = 0) -> None:
        self.limits = limits
        self.fd = fd
        self.lines = Lines(limits.request_bytes)
        self.queue: collections.deque[str] = collections.deque()
        self.write: Sender | None = None
        self.ready = anyio.Event()
        self.ended = False

    def answer_on(self, write: Sender) -> None:
        self.write = write
        self.ready.set()

    def __aiter__(self) -> Stdin:
        return self

    async def __anext__(self) -> str:
        while not self.queue:
            if self.ended:
                raise StopAsyncIteration
            # a thread, as the SDK's own reader: a pipe, a file or a terminal alike
            chunk = await anyio.to_thread.run_sync(os.read, self.fd, CHUNK,
                                                   abandon_on_cancel=True)
            if not chunk:
                self.ended, chunk = True, b"\n"  # a last line without its newline counts
            for event in self.lines.feed(chunk):
                line, answer = inbound(event, self.limits)
                if line is not None:
                    self.queue.append(line.decode("utf-8", "replace"))
                elif answer is not None:
                    await self._answer(answer)
        return self.queue.popleft()

    async def _answer(self, answer: types.JSONRPCResponse | types.JSONRPCError) -> None:
        await self.ready.wait()
        assert self.write is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self.write.send(SessionMessage(answer))


class BodyGuard:
    """An ASGI layer in front of the SDK's streamable HTTP handler (behind its bearer check):
    a POST body past a limit is answered here and never parsed. A body over the size is read
    to its end without being kept (the client is still sending it; an answer before that
    would break its connection)."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []
        size = 0
        kept: bytes | None = None  # the head of a body past the size, once it is
        trailing: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                trailing.append(message)
                break
            body = bytes(message.get("body", b""))
            size += len(body)
            if kept is None:
                if size > self.limits.request_bytes:
                    kept = b"".join(parts)[:HEAD_BYTES] + body[:HEAD_BYTES]
                    parts = []
                else:
                    parts.append(body)
            if not message.get("more_body", False):
                break
        if kept is not None:
            await _answer_http(refusal(head(kept), self.limits.over_size()), send)
            return
        whole = b"".join(parts)
        deep = too_deep(whole)
        if deep is not None:
            await _answer_http(refusal(deep, TOO_DEEP), send)
            return
        replay: collections.deque[Message] = collections.deque(
            [{"type": "http.request", "body": whole, "more_body": False}, *trailing])

        async def again() -> Message:
            return replay.popleft() if replay else await receive()

        await self.app(scope, again, send)


async def _answer_http(answer: types.JSONRPCResponse | types.JSONRPCError | None,
                       send: Send) -> None:
    """A tool call's error result as a plain JSON answer (200: it names its request); a
    JSON-RPC error as 400 with the error as its body, which an SDK client takes as the answer
    to the request it posted, even with no id in it."""
    if answer is None:
        answer = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
            code=types.INVALID_REQUEST, message="Refused before it was read: over a limit"))
    status = 200 if isinstance(answer, types.JSONRPCResponse) else 400
    body = dumped(answer)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
