"""``pending-actions mcp-proxy``: an MCP server in front of another one (the upstream). It
offers the upstream's tools under their own names (schemas, annotations) beside ``resolve`` and
``pending``. A call of an upstream tool is decided by ``decide``, the one place that does:

- ``allow``: forwarded at once; the answer is the upstream's result;
- ``deny``: not run; an error result with the reason (denied by the tenant's policy: staged,
  so that the stage decides it again and the session's history records ``denied``);
- ``ask``: staged as ``pending-action:<tool>:<seq>`` with the arguments as its payload (and
  the tool's ``inputSchema`` as its schema, which a person's edit must meet) and the apply
  handler ``mcp:NAME``; a worker that has the same upstream calls it when ``resolve`` applies.

Arguments larger than ``max_payload_bytes`` or deeper than ``MAX_DEPTH`` are refused before
anything is decided: an error result, nothing run or staged."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import mcp_types as types
import orjson
from mcp.server.mcpserver import Context

from pending_actions.broker.errors import Denied, InvalidInput, PendingActionsError
from pending_actions.broker.payloads import check_json, check_schema
from pending_actions.broker.texts import REMINDER
from pending_actions.mcp import texts
from pending_actions.mcp.client import Connection, UpstreamError
from pending_actions.mcp.server import (
    PENDING,
    RESOLVE,
    Backend,
    SessionServer,
    Where,
    error_result,
    text_result,
)
from pending_actions.mcp.upstreams import OURS, Upstream

log = logging.getLogger("pending_actions.mcp")
Decision = Literal["allow", "ask", "deny"]
LABEL_CHARS = 200


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str
    rule: str | None = None  # the policy rule that decided; None: no policy did
    # decided by the tenant's policy in Redis: a denied call then goes to the stage, which
    # decides it again and records ``denied`` in the session's history (the audit trail)
    tenants: bool = False


# A tenant's policy, as the policies issue plugs it in: called with (tenant, session, tool,
# arguments, annotations), it returns its verdict, or None where the tenant has no policy.
Policy = Callable[[str, str, str, dict[str, Any], types.ToolAnnotations | None],
                  Verdict | Awaitable[Verdict | None] | None]


async def decide(tenant: str, session: str, tool: str, arguments: dict[str, Any],
                 annotations: types.ToolAnnotations | None,
                 policy: Policy | None = None) -> Verdict:
    """Allow, ask or deny one call of an upstream tool. The tenant's policy decides when it has
    one; without, the upstream's own ``readOnlyHint``: a tool it marks read-only is allowed,
    every other is asked. A hint never denies: only a policy refuses outright."""
    if policy is not None:
        verdict = policy(tenant, session, tool, arguments, annotations)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is not None:
            return verdict
    if annotations is not None and annotations.read_only_hint:
        return Verdict("allow", "the upstream marks it read-only (readOnlyHint)")
    return Verdict("ask", "the upstream does not mark it read-only (no readOnlyHint)")


def label(tool: str, arguments: dict[str, Any], limit: int) -> str:
    """What people see of a staged call: the tool and its arguments, cut to ``limit``."""
    text = f"{tool} {orjson.dumps(arguments).decode()}"
    return text if len(text) <= limit else text[:limit - 1] + "…"


class ProxyServer(SessionServer):
    def __init__(self, backend: Backend, session: str, tenant: str, upstream: Upstream,
                 connection: Connection, tools: list[types.Tool],
                 policy: Policy | None = None) -> None:
        super().__init__(backend, session, tenant)
        self.upstream = upstream
        self.connection = connection
        self.policy = policy or self.tenants_policy
        # without their outputSchema: a staged call's answer is our text, not the tool's
        # structured result, and a client checks every answer against the schema it was given
        self.tools = {t.name: t.model_copy(update={"output_schema": None}) for t in tools}
        # a schema that jsonschema cannot read stages without one: edits go unchecked
        self.schemas = {t.name: _schema(upstream, t) for t in tools}

    async def tenants_policy(self, tenant: str, session: str, tool: str,
                             arguments: dict[str, Any],
                             _annotations: types.ToolAnnotations | None) -> Verdict | None:
        """The tenant's policy in force (docs/policies.md), asked about the call as it would be
        staged: ``tool`` the tool's name, ``payload`` its arguments, ``apply`` the upstream's
        handler, its label."""
        found = await self.backend.decide(
            session=session, tool=tool, apply=self.upstream.handler, payload=arguments,
            label=label(tool, arguments, min(LABEL_CHARS, self.backend.settings.max_label_chars)),
            tenant=tenant)
        if found is None:
            return None
        why = found.reason or (f"asked of people by policy rule {found.rule}"
                               if found.decision == "ask" else f"{found.decision} by policy")
        return Verdict(found.decision, why, found.rule, tenants=True)

    async def list_tools(self) -> list[types.Tool]:
        return [*self.tools.values(), RESOLVE, PENDING]

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None
                        ) -> types.CallToolResult | types.InputRequiredResult:
        tool = self.tools.get(name)
        if name in OURS or tool is None:
            return await super().call_tool(name, arguments, context)
        try:
            where = await self.where(context)
        except PendingActionsError as exc:  # Redis unavailable: nothing runs
            return error_result(texts.not_staged(str(exc).rstrip(".")))
        settings = self.backend.settings
        try:
            check_json(arguments, "arguments", settings.max_payload_bytes)
        except InvalidInput as exc:
            return error_result(texts.not_staged(str(exc)))
        if where.foreign:
            # claimed by another tenant since the proxy started: nothing is forwarded on it,
            # and the stage refuses it as it refuses any stage into another tenant's session
            # (and writes nothing); no policy of ours is asked about a session not ours
            return await self.stage(where, name, arguments)
        try:
            verdict = await decide(where.tenant, where.session, name, arguments,
                                   tool.annotations, self.policy)
        except PendingActionsError as exc:  # the policy could not be read: nothing runs
            return error_result(texts.not_staged(str(exc).rstrip(".")))
        if verdict.decision == "deny" and not verdict.tenants:
            return error_result(texts.denied(verdict.reason, verdict.rule))
        if verdict.decision == "allow":
            # the proxy calls its upstream itself: only while the workers, which apply its
            # staged calls, serve this tenant by that upstream (--mcp-upstream-tenants there)
            try:
                served = await self.backend.admits(self.upstream.handler, where.tenant)
            except PendingActionsError as exc:
                return error_result(texts.not_staged(str(exc).rstrip(".")))
            if not served:
                return error_result(texts.denied(
                    f"MCP upstream {self.upstream.name} does not serve tenant {where.tenant!r}",
                    None))
            return await self.forward(where, name, arguments)
        return await self.stage(where, name, arguments)

    async def forward(self, where: Where, tool: str,
                      arguments: dict[str, Any]) -> types.CallToolResult:
        """The upstream's result, with the reminder while something is pending (asked for
        at the same time, so it adds no round trip to the call's own)."""
        reminder: list[str | None] = [None]

        async def ask() -> None:
            with contextlib.suppress(PendingActionsError):  # no reminder, not no answer
                reminder[0] = await self.backend.reminder(where.session)

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            try:
                result = await self.connection.call(tool, arguments)
            except UpstreamError as exc:
                result = error_result(str(exc))
        if reminder[0] is None:
            return result
        return result.model_copy(update={
            "content": [*result.content, types.TextContent(type="text", text=reminder[0])]})

    async def stage(self, where: Where, tool: str,
                    arguments: dict[str, Any]) -> types.CallToolResult:
        settings = self.backend.settings
        try:
            action_id = await self.backend.stage(
                session=where.session, tool=tool, apply=self.upstream.handler,
                label=label(tool, arguments, min(LABEL_CHARS, settings.max_label_chars)),
                payload=arguments, schema=self.schemas.get(tool), tenant=where.tenant)
        except Denied as exc:  # recorded as denied in the session's history
            return error_result(texts.denied(exc.reason or "not allowed", exc.rule))
        except PendingActionsError as exc:
            return error_result(texts.not_staged(str(exc).rstrip(".")))
        return text_result(texts.staged(action_id, tool), REMINDER)


def _schema(upstream: Upstream, tool: types.Tool) -> dict[str, Any] | None:
    try:
        return check_schema(tool.input_schema)
    except InvalidInput as exc:
        log.warning("MCP upstream %s: the inputSchema of %s is not one jsonschema reads (%s); "
                    "its staged calls are edited unchecked", upstream.name, tool.name, exc)
        return None
