"""A real MCP server for the tests and the MCP benchmark, over stdio, built on the official SDK:
tools that read and write files in one folder, and one that misbehaves on purpose.

    python -m tests.support.mcp_upstream FOLDER [--start exit|garbage|hang] [--tool NAME]...

``write_file`` honours the idempotency key pending-actions passes in a call's ``_meta``
(``pending-actions/idempotency-key``): the keys it has applied are kept, with their results, in
``FOLDER/.applied.jsonl``, and a key seen again answers the first result and writes nothing. Every
write it does make is one line of ``FOLDER/.writes.jsonl`` (path, key, attempt, time), which is
what the tests count. ``--start`` makes it fail before it answers ``initialize``; each
``--tool NAME`` adds a tool of that name (a clash with ours, a name that cannot be a tool's);
``--pause-after-write SECONDS`` answers a write that long after making it; ``--chatter`` writes
lines on its stderr as it starts and stops, two in one write and one cut in two writes, and
ends on a line with no newline (``CHATTER``: the lines they make)."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

KEY = "pending-actions/idempotency-key"
# what --chatter writes on stderr, in these writes: as it starts, and after it stopped serving
CHATTER_WRITES = (b"starting\nready, half", b" a line\nbye")
CHATTER = ["starting", "ready, half a line", "bye"]
ATTEMPT = "pending-actions/attempt"
READ_ONLY = ToolAnnotations(read_only_hint=True)


def build(folder: Path, extra_tools: list[str], pause_s: float = 0.0) -> MCPServer:
    server: MCPServer = MCPServer("files", log_level="WARNING")

    def inside(path: str) -> Path:
        target = (folder / path).resolve()
        if not target.is_relative_to(folder):
            raise ToolError(f"{path}: outside the folder")
        return target

    @server.tool(annotations=READ_ONLY)
    def read_file(path: str) -> str:
        """Read a text file of the folder."""
        try:
            return inside(path).read_text()
        except FileNotFoundError:
            raise ToolError(f"{path}: no such file") from None

    @server.tool()
    def write_file(path: str, text: str, ctx: Context) -> str:
        """Write a text file of the folder (replacing it)."""
        meta: dict[str, Any] = dict(ctx.request_context.meta or {})
        key, attempt = meta.get(KEY), meta.get(ATTEMPT)
        applied = folder / ".applied.jsonl"
        with (folder / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process of this server per worker process
            if key and applied.exists():
                for line in applied.read_text().splitlines():
                    seen = json.loads(line)
                    if seen["key"] == key:
                        return str(seen["result"])
            inside(path).write_text(text)
            _append(folder / ".writes.jsonl", {"path": path, "key": key, "attempt": attempt,
                                                "at": time.time(), "pid": os.getpid()})
            result = f"Wrote {len(text)} characters to {path}"
            if key:
                _append(applied, {"key": key, "result": result})
        time.sleep(pause_s)  # written, not yet answered: where a fault test kills its caller
        return result

    @server.tool(annotations=READ_ONLY)
    async def fail(how: str) -> str:
        """Fail as asked: error (an error result), crash (exit mid-call), garbage (write a line
        that is not JSON-RPC instead of an answer), hang (never answer)."""
        if how == "error":
            raise ToolError("disk full")
        if how == "crash":
            os._exit(3)
        if how == "garbage":
            os.write(_wire(), b"this is not JSON-RPC\n")
        await anyio.sleep(3600)
        return "never"

    for name in extra_tools:
        server.add_tool(lambda: "extra", name=name, description="an extra tool")
    return server


# the SDK's stdio server answers on a private copy of fd 1 and points fd 1 itself at stderr
# (stray prints miss the wire): the pipe it started on, to find that copy by
_STDOUT = os.fstat(1)


def _wire() -> int:
    for fd in range(3, 1024):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (_STDOUT.st_dev, _STDOUT.st_ino):
            return fd
    return 1


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--start", choices=["exit", "garbage", "hang"])
    parser.add_argument("--tool", action="append", default=[])
    parser.add_argument("--pause-after-write", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--chatter", action="store_true")
    args = parser.parse_args()
    if args.chatter:
        os.write(2, CHATTER_WRITES[0])
    if args.start == "exit":
        sys.exit(3)
    if args.start == "garbage":
        sys.stdout.write("Welcome! this line is not JSON-RPC\n")
        sys.stdout.flush()
    if args.start == "hang":
        time.sleep(3600)
    folder = args.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    build(folder, args.tool, args.pause_after_write).run("stdio")
    if args.chatter:
        os.write(2, CHATTER_WRITES[1])


if __name__ == "__main__":
    main()
