"""What every command shares: the context object (settings, client, output), the common
options, and the one way a command fails."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson
from pydantic import ValidationError

from pending_actions.broker.errors import ConfigError, InvalidInput
from pending_actions.broker.settings import Settings


class BadInput(click.ClickException):
    """Input refused (a bad URL, a field the service refused): exit 2 like a usage error, but
    one line, without the usage banner."""

    exit_code = 2


class Obj:
    def __init__(self, redis_url: str | None, as_json: bool, url_given: bool = False) -> None:
        self.redis_url = redis_url
        self.as_json = as_json
        # --redis-url on the command line, not PENDING_ACTIONS_REDIS_URL: `up` tells them apart
        self.url_given = url_given

    def settings(self) -> Settings:
        try:
            base = Settings()
        except ValidationError as exc:  # pydantic's own text runs over lines, with a link
            raise click.UsageError("bad setting " + "; ".join(
                f"PENDING_ACTIONS_{'_'.join(str(part) for part in e['loc']).upper()}: "
                f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())) from None
        if self.redis_url:
            return base.model_copy(update={"redis_url": self.redis_url})
        return base

    def client(self) -> Any:
        from pending_actions.producers import PendingActions

        settings = self.settings()
        if not settings.redis_url:
            raise click.UsageError("no Redis: pass --redis-url or set PENDING_ACTIONS_REDIS_URL")
        try:
            return PendingActions(settings)
        except ValueError as exc:  # redis-py's word for a URL it cannot read
            raise BadInput(f"bad Redis URL {settings.redis_url!r}: {exc}") from None

    def out(self, value: Any, human: str) -> None:
        if self.as_json:
            click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
        else:
            click.echo(human)


SESSION = click.option(
    "--session", required=True, metavar="SESSION",
    help="Agent session id: 1-128 characters of A-Z a-z 0-9 . _ : -")


MCP_UPSTREAM = click.option(
    "--mcp-upstream", "mcp_upstreams", multiple=True, metavar="NAME='COMMAND ARGS'",
    help="An MCP server (stdio) the operator allows, by name (repeatable; adds to "
         "PENDING_ACTIONS_MCP_UPSTREAMS). Needs the 'mcp' extra.")
MCP_UPSTREAM_TENANTS = click.option(
    "--mcp-upstream-tenants", "mcp_upstream_tenants", multiple=True, metavar="NAME=T1,T2",
    help="Keep the MCP upstream NAME to these tenants (repeatable; adds to "
         "PENDING_ACTIONS_MCP_UPSTREAM_TENANTS): another tenant's stage of mcp:NAME is refused "
         "and its mcp-proxy does not start. Without it, an upstream serves every tenant.")


def fail(exc: Exception) -> NoReturn:
    if isinstance(exc, InvalidInput | ConfigError):
        raise BadInput(str(exc))
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def json_object(name: str, text: str | None) -> dict[str, Any] | None:
    """A JSON object given inline, as ``@FILE`` (read from the file) or ``-`` (stdin): a
    payload can be larger than a command line."""
    if text is None:
        return None
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise BadInput(f"invalid {name}: cannot read {text[1:]}: {exc.strerror}") from None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"invalid {name}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadInput(f"invalid {name}: must be a JSON object")
    return value

