"""``pending-actions mcp``: the ``resolve`` tool (the schema and description of
``tool_definition``) and ``pending``, served over MCP by the SDK's ``MCPServer``, for one
session. ``mcp-proxy`` (``proxy.py``) is this server plus another server's tools.

A tool result's text is the rendered result (``render``: Accept, Discard or Failed, the label,
the reason, the handler's text) and ``isError`` is ``is_error``; the whole result is in the
result's ``_meta`` (``RESULT_META``) for programs. MCP cannot force the next tool choice, so
the soft requirement travels the only way it can: every result of another tool of ours, while
something is pending, ends with the reminder.

Over streamable HTTP a bearer token of ``serve``'s kind is required (a producer's or an
admin's: the model's side; an approver's is refused) and fixes the tenant; the session comes
from the ``SESSION_HEADER`` header (else ``--session``), never from a model's arguments, and a
session of another tenant is refused like one that does not exist."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import anyio.to_thread
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette

from pending_actions.broker.errors import ConfigError, PendingActionsError
from pending_actions.broker.models import PendingAction, ResolveInput, Result, check_session
from pending_actions.broker.policy import rules
from pending_actions.broker.results import nothing_to_target
from pending_actions.broker.settings import Settings
from pending_actions.broker.texts import REMINDER
from pending_actions.mcp import texts
from pending_actions.mcp.upstreams import OURS
from pending_actions.mcp.wire import BodyGuard, Limits, Stdin
from pending_actions.producers import AsyncPendingActions, PendingActions
from pending_actions.producers.tool import DESCRIPTION, PARAMETERS, render
from pending_actions.serve.auth import ROLES, Tokens

T = TypeVar("T")
SESSION_HEADER = "Pending-Actions-Session"
RESULT_META = "pending-actions/result"
# what `pending` lists: the head and the next ones, each a label (max_label_chars) and a
# bounded error; the rest is a count
SHOWN = 10
ERROR_CHARS = 200

RESOLVE = types.Tool(name="resolve", title="Resolve", description=DESCRIPTION,
                     input_schema=PARAMETERS)
PENDING = types.Tool(name="pending", title="Pending actions",
                     description=texts.PENDING_DESCRIPTION,
                     input_schema={"type": "object", "properties": {},
                                   "additionalProperties": False},
                     annotations=types.ToolAnnotations(read_only_hint=True))


def text_result(*texts_: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts_],
                                is_error=is_error)


def error_result(text: str) -> types.CallToolResult:
    return text_result(text, is_error=True)


class Backend:
    """The service as the MCP servers call it: the asyncio client (made on first use, on the
    server's loop), or where that cannot run (a Redis Cluster with REPLICA_WAIT) the blocking
    one in threads."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._aio: AsyncPendingActions | None = None
        self._blocking: PendingActions | None = None

    async def _call(self, method: str, **kwargs: Any) -> Any:
        if self._aio is None and self._blocking is None:
            try:
                self._aio = AsyncPendingActions(self.settings)
            except ConfigError:
                self._blocking = PendingActions(self.settings)
        if self._aio is not None:
            return await getattr(self._aio, method)(**kwargs)
        assert self._blocking is not None
        return await anyio.to_thread.run_sync(
            functools.partial(getattr(self._blocking, method), **kwargs))

    async def stage(self, **kwargs: Any) -> str:
        action_id: str = await self._call("stage", **kwargs)
        return action_id

    async def resolve(self, session: str, arguments: dict[str, Any], tenant: str) -> Result:
        """The model's call: its arguments go only where a model's may (never an approver),
        as ``tenant``'s (the take finds nothing in another tenant's session)."""
        result: Result = await self._call("resolve_tool_call", session=session,
                                          arguments=arguments, tenant=tenant)
        return result

    async def pending(self, session: str, limit: int) -> list[PendingAction]:
        """Every action in flight and the first ``limit`` of the stack."""
        items: list[PendingAction] = await self._call("pending", session=session, limit=limit)
        return items

    async def depth(self, session: str) -> int:
        found: int = await self._call("stack_depth", session=session)
        return found

    async def reminder(self, session: str) -> str | None:
        """The reminder while the session's soft requirement says to resolve, else None."""
        choice: dict[str, Any] | None = await self._call("next_tool_choice", session=session)
        return choice.get("reminder") if choice and choice.get("tool") == "resolve" else None

    async def decide(self, **kwargs: Any) -> rules.Verdict | None:
        verdict: rules.Verdict | None = await self._call("decide", **kwargs)
        return verdict

    async def admits(self, handler: str, tenant: str) -> bool:
        found: bool = await self._call("admits", handler=handler, tenant=tenant)
        return found

    async def tenant_of(self, session: str) -> str | None:
        owner: str | None = await self._call("tenant_of", session=session)
        return owner

    async def close(self) -> None:
        if self._aio is not None:
            await self._aio.close()
        if self._blocking is not None:
            self._blocking.close()


class TokenVerifier:
    """``serve``'s bearer tokens as the SDK's token verifier: a token's role is its scope (an
    admin's has every role), its tenant a claim."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        who = await anyio.to_thread.run_sync(self.tokens.lookup, token)
        if who is None:
            return None
        scopes: list[str] = list(ROLES) if who.role == "admin" else [who.role]
        return AccessToken(token=token, client_id=who.name, scopes=scopes,
                           claims={"tenant": who.tenant, "role": who.role})


def http_auth(settings: Settings, host: str, port: int) -> dict[str, Any]:
    """The MCPServer arguments that require a producer's (or an admin's) token on every
    request; no OAuth server: tokens are made with ``pending-actions token create``."""
    pa = PendingActions(settings)
    return {"token_verifier": TokenVerifier(Tokens(pa.client, pa.ctx.keys)),
            "auth": AuthSettings(issuer_url=f"http://{host}:{port}",  # type: ignore[arg-type]
                                 resource_server_url=None, required_scopes=["producer"])}


@dataclass(frozen=True)
class Where:
    """Whose call this is: its session and tenant, never from the model's arguments, and the
    session's owner as read at this call (a session is claimed by its first stage, which may
    be another tenant's after the server started)."""

    session: str
    tenant: str
    owner: str | None = None
    http: bool = False

    @property
    def foreign(self) -> bool:
        return self.owner is not None and self.owner != self.tenant

    @property
    def empty(self) -> bool:
        """Nothing of the session is the caller's: another tenant's session, told as one that
        does not exist, or (HTTP) one that no tenant has claimed yet (its slots are nobody's
        token's to resolve)."""
        return self.foreign or (self.http and self.owner is None)


class SessionServer(MCPServer[Any]):
    """``resolve`` and ``pending`` for one session (stdio), or for the session each request
    names (HTTP, ``http=True``)."""

    def __init__(self, backend: Backend, session: str | None, tenant: str, *,
                 http: bool = False, **kwargs: Any) -> None:
        super().__init__("pending-actions", instructions=texts.instructions(session),
                         log_level="WARNING", **kwargs)
        self.backend = backend
        self.session = session
        self.tenant = tenant
        self.http = http
        self.limits = Limits.of(backend.settings)

    async def run_stdio_async(self) -> None:
        """The SDK's stdio transport with our stdin under it (``wire.Stdin``): a request past a
        limit is answered at once instead of reaching the SDK's parser, which drops what it
        cannot parse unanswered. The rest is what the SDK's own method does."""
        stdin = Stdin(self.limits)
        async with stdio_server(stdin=cast(Any, stdin)) as (read, write):
            stdin.answer_on(write)
            await self._lowlevel_server.run(
                read, write, self._lowlevel_server.create_initialization_options())

    def http_app(self, host: str) -> Starlette:
        """The streamable HTTP app with ``wire.BodyGuard`` behind the bearer check: a body past
        a limit is answered before the SDK reads it (the SDK's own cap, given ours, is then
        never reached)."""
        app = self.streamable_http_app(host=host,
                                       max_request_body_size=self.limits.request_bytes)
        manager: Any = self.session_manager  # (typed as the one layer the SDK puts there)
        manager.asgi_app = BodyGuard(manager.asgi_app, self.limits)
        return app

    async def list_tools(self) -> list[types.Tool]:
        return [RESOLVE, PENDING]

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None
                        ) -> types.CallToolResult | types.InputRequiredResult:
        if name not in OURS:
            return error_result(texts.unknown_tool(name))
        try:
            where = await self.where(context)
            return await (self.resolve(where, arguments) if name == "resolve"
                          else self.pending(where))
        except PendingActionsError as exc:  # refused input, Redis unavailable: one line
            return error_result(str(exc))

    async def where(self, context: Context[Any, Any] | None) -> Where:
        """The call's session and tenant, and the session's owner read now: at every call,
        not once at start."""
        if not self.http:
            assert self.session is not None
            session, tenant = self.session, self.tenant
        else:
            request = context.request_context.request if context is not None else None
            user = request.scope.get("user") if request is not None else None
            if not isinstance(user, AuthenticatedUser):  # the SDK's middleware let none through
                raise Refused("no bearer token")
            tenant = str((user.access_token.claims or {}).get("tenant"))
            header = request.headers.get(SESSION_HEADER) if request is not None else None
            session = header or self.session or ""
            if not session:
                raise Refused(texts.no_session(SESSION_HEADER))
        check_session(session)
        return Where(session, tenant, await self.backend.tenant_of(session), self.http)

    async def resolve(self, where: Where, arguments: dict[str, Any]) -> types.CallToolResult:
        given = ResolveInput.of_call(arguments)  # the model's: never an approver, an edit
        if where.empty:  # what a session with nothing in it answers, word for word
            result = nothing_to_target(given.action, given.reason, given.extra)
        else:
            result = await self.backend.resolve(where.session, arguments, where.tenant)
        return tool_result(result)

    async def pending(self, where: Where) -> types.CallToolResult:
        """The first ``SHOWN`` (in flight first, then the head first) and how many more: the
        text a model reads stays short however deep the stack is (a write loop had built 2,002
        and a 252 KB text). Only those are read, and the stack's depth."""
        items: list[PendingAction] = []
        depth = 0
        if not where.empty:
            items = await self.backend.pending(where.session, SHOWN)
            depth = await self.backend.depth(where.session) if len(items) >= SHOWN else 0
        # one staged by another tenant after this call's owner check: not shown
        items = [a for a in items if a.tenant == where.tenant]
        if not items:
            return text_result(texts.NOTHING_PENDING)
        shown = items[:SHOWN]
        in_flight = sum(a.state == "in_flight" for a in items)
        total = max(len(items), in_flight + depth)
        lines = [f"{total} pending (resolve takes the first one that is not in flight):"]
        lines += [_line(n, a) for n, a in enumerate(shown, 1)]
        if total > len(shown):
            lines.append(texts.more_pending(total - len(shown)))
        waiting = any(a.state == "pending" for a in items)
        return text_result("\n".join(lines), *([REMINDER] if waiting else []))


class Refused(PendingActionsError):
    """A request the server refuses before anything is read (no token, no session)."""


def tool_result(result: Result) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=render(result))],
        is_error=result.is_error, _meta={RESULT_META: result.model_dump(mode="json")})


def _line(n: int, a: PendingAction) -> str:
    state = " (in flight: being applied now)" if a.state == "in_flight" else ""
    last = a.last_error or ""
    if len(last) > ERROR_CHARS:  # a handler's error text has no bound of its own
        last = last[:ERROR_CHARS - 1] + "…"
    error = f"; last error: {last}" if last else ""
    return f"{n}. {a.id}: {a.label}{state} (attempts {a.attempts}{error})"
