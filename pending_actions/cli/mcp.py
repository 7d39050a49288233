"""``mcp`` and ``mcp-proxy``: the commands an MCP client starts (stdio) or an operator runs
(``mcp --transport http``). The SDK is imported only when one of them runs, so the rest of the
CLI works without the ``mcp`` extra. What can be refused is refused before serving, in one
line: no Redis, a session of another tenant, an unknown upstream, one that does not start or
whose tools cannot be proxied."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, get_args

import click

from pending_actions.broker import tracing
from pending_actions.broker.errors import ConfigError, PendingActionsError
from pending_actions.broker.models import DEFAULT_TENANT, check_session, check_tenant
from pending_actions.broker.settings import Settings
from pending_actions.cli.base import MCP_UPSTREAM, MCP_UPSTREAM_TENANTS, SESSION, Obj, fail

# --transport: stdio (an MCP client starts it) or streamable HTTP
Transport = Literal["stdio", "http"]


def _need_sdk(command: str) -> None:
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError as exc:
        raise click.UsageError(f"{command} needs the 'mcp' extra ({exc.name} is missing): "
                               "pip install 'pending-actions[mcp]'") from None


def _settings(obj: Obj) -> Settings:
    settings = obj.settings()
    if not settings.redis_url:
        raise click.UsageError("no Redis: pass --redis-url or set PENDING_ACTIONS_REDIS_URL")
    return settings


def _run(main: Callable[[], Awaitable[None]]) -> None:
    """``main`` on an event loop; a refusal it raises (in a task group too) is one line."""
    import anyio

    tracing.setup("pending-actions-mcp")  # from the OTEL_* variables alone
    try:
        anyio.run(main)
    except BaseExceptionGroup as group:
        found = group.subgroup(lambda e: isinstance(e, PendingActionsError))
        if found is None:
            raise
        first: BaseException = found
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        fail(first if isinstance(first, Exception) else ConfigError(str(first)))
    except PendingActionsError as exc:
        fail(exc)


async def _owned(backend: Any, session: str, tenant: str) -> None:
    """Redis answers, and the session is the tenant's or nobody's yet."""
    owner = await backend.tenant_of(session)
    if owner not in (None, tenant):
        raise ConfigError(f"session {session} belongs to another tenant than {tenant}")


@click.command("mcp")
@click.option("--session", metavar="SESSION",
              help="The session served (stdio: required; http: the one of a request that sends "
                   "no Pending-Actions-Session header).")
@click.option("--transport", type=click.Choice(get_args(Transport)), default="stdio",
              show_default=True, help="stdio (an MCP client starts it) or streamable HTTP.")
@click.option("--host", default="127.0.0.1", show_default=True, help="(http) Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8090, show_default=True,
              help="(http) Port to listen on.")
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True,
              help="(stdio) The tenant whose session it is: another tenant's session is "
                   "answered as one with nothing in it. (http: the token's tenant.)")
@click.pass_obj
def mcp_(obj: Obj, session: str | None, transport: Transport, host: str, port: int,
         tenant: str) -> None:
    """Serve the `resolve` and `pending` tools over MCP (needs the 'mcp' extra).

    Over stdio, for --session. Over HTTP (endpoint /mcp), every request needs
    `Authorization: Bearer <token>` of a producer or admin token (`token create`), which fixes
    the tenant; the session is the Pending-Actions-Session header's."""
    _need_sdk("mcp")
    settings = _settings(obj)
    try:
        check_tenant(tenant)
        if session is not None:
            check_session(session)
        elif transport == "stdio":
            raise click.UsageError("--session is required with --transport stdio")
    except PendingActionsError as exc:
        fail(exc)
    from pending_actions.mcp.server import Backend, SessionServer

    if transport == "http":
        _serve_http(settings, session, host, port)
        return

    async def main() -> None:
        assert session is not None
        backend = Backend(settings)
        try:
            await backend.tenant_of(session)  # Redis answers, before the client is told we do
            await SessionServer(backend, session, tenant).run_stdio_async()
        finally:
            await backend.close()

    _run(main)


def _serve_http(settings: Settings, session: str | None, host: str, port: int) -> None:
    from pending_actions.mcp.server import Backend, SessionServer, http_auth
    from pending_actions.serve import listen

    try:
        sock = listen.bind(host, port)
    except ConfigError as exc:
        fail(exc)
    server = SessionServer(Backend(settings), session, DEFAULT_TENANT, http=True,
                           **http_auth(settings, host, port))
    click.echo(f"MCP (streamable HTTP) on http://{host}:{port}/mcp", err=True)
    # held to serve's connection deadlines: the same port kind, the same slow clients
    listen.run(server.http_app(host), sock, limits=listen.Limits.of(settings))


@click.command("mcp-proxy")
@SESSION
@click.option("--upstream", required=True, metavar="NAME",
              help="The MCP server to stand in front of: a name of --mcp-upstream or of "
                   "PENDING_ACTIONS_MCP_UPSTREAMS.")
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True,
              help="The tenant whose session it is (and whose policy decides).")
@MCP_UPSTREAM
@MCP_UPSTREAM_TENANTS
@click.pass_obj
def mcp_proxy(obj: Obj, session: str, upstream: str, tenant: str,
              mcp_upstreams: tuple[str, ...], mcp_upstream_tenants: tuple[str, ...]) -> None:
    """Serve an MCP server's tools, staging the calls that would change something (needs the
    'mcp' extra).

    A call of a tool the upstream marks read-only goes through at once; any other is staged as
    a pending action, and `resolve` (served here too) applies it: a worker started with the
    same --mcp-upstream calls the tool then. Stdio: an MCP client starts this command."""
    _need_sdk("mcp-proxy")
    from pending_actions.mcp.upstreams import check_tool_names, pick, serves, with_options

    try:
        check_session(session)
        check_tenant(tenant)
        settings = with_options(_settings(obj), mcp_upstreams, mcp_upstream_tenants)
        up = pick(settings, upstream)
        if not serves(settings, up, tenant):
            # it would forward this tenant's reads itself: an upstream kept to others is not
            # started for it at all
            raise ConfigError(f"MCP upstream {up.name} serves tenant(s) "
                              f"{', '.join(settings.mcp_upstream_tenants[up.name])} only, not "
                              f"{tenant!r} (--mcp-upstream-tenants)")
    except PendingActionsError as exc:
        fail(exc)
    from pending_actions.mcp.client import Connection, UpstreamError, quiet_sdk_logs
    from pending_actions.mcp.proxy import ProxyServer
    from pending_actions.mcp.server import Backend

    quiet_sdk_logs()

    async def main() -> None:
        backend = Backend(settings)
        try:
            await _owned(backend, session, tenant)
            async with Connection(up, settings.mcp_start_timeout_s,
                                  settings.mcp_call_timeout_s,
                                  max_result_bytes=settings.mcp_max_result_bytes) as connection:
                try:
                    tools = await connection.tools()
                except UpstreamError as exc:
                    raise ConfigError(str(exc)) from None
                check_tool_names(up, [t.name for t in tools])
                await ProxyServer(backend, session, tenant, up, connection,
                                  tools).run_stdio_async()
        finally:
            await backend.close()

    _run(main)
