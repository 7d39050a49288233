"""The MCP servers an operator allows ("upstreams"), by name: ``--mcp-upstream NAME='COMMAND
ARGS'`` (repeatable) over the ``mcp_upstreams`` setting. A model never names a command: the
proxy and the workers only ever start what is listed here. Needs no MCP SDK, so that the CLI
can refuse a bad option before anything is imported or started."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from pending_actions.broker.errors import ConfigError, InvalidInput
from pending_actions.broker.models import TOOL_RE, check_tenant
from pending_actions.broker.settings import Settings

# no ':' in a name, so that the handler name ``mcp:NAME`` reads one way only
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")
HANDLER_PREFIX = "mcp:"
# the tools the proxy serves itself: an upstream's tool of the same name would be hidden
OURS = ("resolve", "pending")


@dataclass(frozen=True)
class Upstream:
    """One allowed upstream: a name and the command that starts it (stdio)."""

    name: str
    argv: tuple[str, ...]

    @property
    def handler(self) -> str:
        """The apply handler of its staged calls, which a worker with the same upstream has."""
        return HANDLER_PREFIX + self.name

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def upstream(name: str, command: str) -> Upstream:
    """``command`` split as a shell would (no shell runs it); ConfigError naming the upstream
    for a bad name or an empty or unbalanced command."""
    if not NAME_RE.match(name):
        raise ConfigError(f"bad MCP upstream name {name!r}: 1-64 characters of "
                          "A-Z a-z 0-9 . _ -")
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise ConfigError(f"MCP upstream {name}: cannot read its command {command!r}: "
                          f"{exc}") from None
    if not argv:
        raise ConfigError(f"MCP upstream {name}: empty command")
    return Upstream(name, argv)


def parse_option(text: str) -> tuple[str, str]:
    """``NAME=COMMAND ARGS`` -> (name, command)."""
    name, sep, command = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"bad --mcp-upstream {text!r}: write NAME='COMMAND ARGS'")
    return name.strip(), command


def with_options(settings: Settings, options: Iterable[str],
                 tenant_options: Iterable[str] = ()) -> Settings:
    """The settings with each ``--mcp-upstream`` option added (an option replaces the setting's
    upstream of the same name) and each ``--mcp-upstream-tenants NAME=T1,T2``, every upstream
    and every tenant checked (the tenants' upstream must be one of them)."""
    merged = dict(settings.mcp_upstreams)
    merged.update(parse_option(o) for o in options)
    for name, command in merged.items():
        upstream(name, command)
    kept = dict(settings.mcp_upstream_tenants)
    kept.update(parse_tenants(o) for o in tenant_options)
    for name, tenants in kept.items():
        if name not in merged:
            raise ConfigError(f"--mcp-upstream-tenants names {name!r}, which is no MCP upstream "
                              f"(configured: {', '.join(sorted(merged)) or 'none'})")
        if not tenants:
            raise ConfigError(f"--mcp-upstream-tenants {name}: no tenant named (an upstream "
                              "kept to nobody is one not configured)")
        for tenant in tenants:
            try:
                check_tenant(tenant)
            except InvalidInput as exc:
                raise ConfigError(f"--mcp-upstream-tenants {name}: {exc}") from None
    return settings.model_copy(update={"mcp_upstreams": merged, "mcp_upstream_tenants": kept})


def parse_tenants(text: str) -> tuple[str, list[str]]:
    """``NAME=T1,T2`` -> (name, [tenants])."""
    name, sep, tenants = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"bad --mcp-upstream-tenants {text!r}: write NAME=TENANT1,TENANT2")
    return name.strip(), [t.strip() for t in tenants.split(",") if t.strip()]


def serves(settings: Settings, up: Upstream, tenant: str) -> bool:
    """Whether ``up`` serves ``tenant`` (``mcp_upstream_tenants``)."""
    kept = settings.mcp_upstream_tenants.get(up.name)
    return kept is None or tenant in kept


def configured(settings: Settings) -> dict[str, Upstream]:
    return {name: upstream(name, command) for name, command in settings.mcp_upstreams.items()}


def pick(settings: Settings, name: str) -> Upstream:
    """The upstream ``name``, or ConfigError saying which ones there are."""
    found = configured(settings)
    if name in found:
        return found[name]
    known = ", ".join(sorted(found)) or "none"
    raise ConfigError(f"unknown MCP upstream {name!r} (configured: {known}); add it with "
                      f"--mcp-upstream {name}='COMMAND ARGS' or PENDING_ACTIONS_MCP_UPSTREAMS")


def check_tool_names(up: Upstream, names: Iterable[str]) -> None:
    """Every tool of ``up`` can be staged as ``pending-action:<tool>:<seq>`` and none hides one
    of ours; else ConfigError naming the first that cannot. Refused rather than renamed: a
    model that reads a tool under another name than its server documents would be misled."""
    for tool in names:
        if tool in OURS:
            raise ConfigError(f"MCP upstream {up.name} has a tool named {tool!r}, which "
                              f"mcp-proxy serves itself ({', '.join(OURS)}); it cannot be proxied")
        if not TOOL_RE.match(tool):
            raise ConfigError(f"MCP upstream {up.name} has a tool named {tool!r}, which cannot "
                              "be a pending action's tool (1-64 characters of A-Z a-z 0-9 . _ -)")
