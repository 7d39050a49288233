"""The MCP tests' parts: the test upstream's command line, a worker that has it, and our MCP
servers run as an MCP client runs them (the SDK's stdio client, a real process)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from pending_actions.broker.models import Result
from pending_actions.embedded import free_port
from pending_actions.procs import ROOT
from tests.support.procs import Worker, worker_env

NAME = "files"


def upstream_command(folder: Path, *flags: str) -> str:
    return shlex.join([sys.executable, "-m", "tests.support.mcp_upstream", str(folder), *flags])


def upstream_option(folder: Path, *flags: str, name: str = NAME) -> str:
    return f"{name}={upstream_command(folder, *flags)}"


class McpWorker(Worker):
    """A worker with the test handlers and ``--mcp-upstream files=...`` on its command line."""

    def __init__(self, url: str, folder: Path, overrides: dict[str, str] | None = None,
                 flags: tuple[str, ...] = (), log_path: Path | None = None) -> None:
        super().__init__(url, overrides=overrides, log_path=log_path)
        self.child.argv += ["--mcp-upstream", upstream_option(folder, *flags)]


def writes(folder: Path) -> list[dict[str, Any]]:
    """Every write the test upstream made, in order."""
    log = folder / ".writes.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@asynccontextmanager
async def connect(url: str, *args: str, errlog: TextIO | None = None,
                  **env: str) -> AsyncIterator[ClientSession]:
    """``pending-actions ARGS...`` as an MCP client starts it, initialized; its stderr to
    ``errlog`` (default: ours)."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "pending_actions", *args], cwd=ROOT,
        env={**worker_env(url), **{f"PENDING_ACTIONS_{k.upper()}": v for k, v in env.items()}})
    async with stdio_client(params, errlog or sys.stderr) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def proxy_args(session: str, folder: Path, *more: str) -> list[str]:
    return ["mcp-proxy", "--session", session, "--upstream", NAME,
            "--mcp-upstream", upstream_option(folder), *more]


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def resolved(result: types.CallToolResult) -> Result:
    """The resolve's own result, which the MCP result carries in its _meta."""
    assert result.meta is not None
    return Result.model_validate(result.meta["pending-actions/result"])


@contextmanager
def http_server(url: str, **env: str) -> Iterator[str]:
    """``pending-actions mcp --transport http`` on a free port: its endpoint, once it says it
    listens (its first line); its later output is read away so that it never blocks on it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pending_actions", "mcp", "--transport", "http", "--port",
         str(port)], cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**worker_env(url), **{f"PENDING_ACTIONS_{k.upper()}": v for k, v in env.items()}})
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("MCP (streamable HTTP) on"), first
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(30)


@asynccontextmanager
async def http_connect(endpoint: str, token: str, session: str) -> AsyncIterator[ClientSession]:
    """An MCP client of ``endpoint`` with ``token`` for ``session``, initialized."""
    headers = {"Authorization": f"Bearer {token}", "Pending-Actions-Session": session}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
            streamable_http_client(endpoint, http_client=http) as (read, write), \
            ClientSession(read, write) as mcp:
        await mcp.initialize()
        yield mcp
