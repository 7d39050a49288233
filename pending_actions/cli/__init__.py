"""``pending-actions``: run the service and talk to it from a shell.

Exit codes: 0 success, 1 an error result (or Redis unavailable), 2 bad usage or bad input.
Every error is one ``error: ...`` line on stderr (after click's usage line for bad usage),
never a traceback. ``--json`` and ``--redis-url`` go before or after the subcommand, as people
type them.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import entry_points
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from pending_actions.broker.errors import ConfigError, InvalidInput, PendingActionsError
from pending_actions.cli.base import Obj

# Commands another distribution adds (the harness's `bench` and `soak`): entry points of this
# group, name -> a click command, loaded when named.
COMMANDS_GROUP = "pending_actions.commands"
# the ones this repo's harness adds, so that without it they say what to install
HARNESS = {"bench": "Run the benchmark", "soak": "Run the fault soak"}


class _Commands(click.Group):
    """The built-in commands, then those of ``COMMANDS_GROUP``, read only when a command is not
    built in (a CLI run reads no other distribution's metadata). Bad usage, found by click
    while it parses or by a command, is shown as ``error: ...`` here, the one style of every
    error of the program (``main``)."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            _refused(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            _refused(exc)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or _added(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        added = {ep.name for ep in entry_points(group=COMMANDS_GROUP)}
        return sorted({*super().list_commands(ctx), *added, *HARNESS})


def _refused(exc: click.ClickException) -> NoReturn:
    """A click error in the program's style: click's usage line and its pointer to --help for
    bad usage, as click shows them, then ``error: ...`` (click's own says ``Error:``), with
    click's exit code (2 for bad usage)."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        raise exc  # a group given no command: its help, as click shows it
    ctx = exc.ctx if isinstance(exc, click.UsageError) else None
    if ctx is not None:
        click.echo(f"{ctx.get_usage()}\nTry '{ctx.command_path} --help' for help.\n", err=True)
    click.echo(f"error: {exc.format_message()}", err=True)
    sys.exit(exc.exit_code)


def _added(name: str) -> click.Command | None:
    found = entry_points(group=COMMANDS_GROUP, name=name)
    if found:
        command: click.Command = next(iter(found)).load()
        _late_options(command)
        return command
    return _not_installed(name) if name in HARNESS else None


def _not_installed(name: str) -> click.Command:
    def fail() -> None:
        raise ConfigError(f"`pending-actions {name}` comes with the pending-actions-harness "
                          "distribution: from a checkout of the repo, pip install ./harness")

    # takes any arguments, so `bench --quick` says what is missing, not that --quick is unknown
    return click.Command(name, callback=fail, help=f"{HARNESS[name]} (needs "
                         "pending-actions-harness).",
                         context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pending-actions", prog_name="pending-actions")
@click.option("--redis-url", envvar="PENDING_ACTIONS_REDIS_URL",
              help="Redis holding the state [env PENDING_ACTIONS_REDIS_URL].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("-v", "--verbose", is_flag=True, help="Log more.")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, as_json: bool, verbose: bool) -> None:
    """Stage, approve and apply AI agent tool actions, on Redis and dramatiq.

    An agent's tool stages a pending action; `resolve` later applies or discards the newest one
    of the session. A failed apply keeps the action pending under the same id."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pika").setLevel(logging.DEBUG if verbose else logging.WARNING)
    given = ctx.get_parameter_source("redis_url") is ParameterSource.COMMANDLINE
    ctx.obj = Obj(redis_url, as_json, url_given=given)


def _register() -> None:
    from pending_actions.cli import actions, service
    from pending_actions.cli.acl import acl
    from pending_actions.cli.health import health
    from pending_actions.cli.mcp import mcp_, mcp_proxy
    from pending_actions.cli.policy import policy
    from pending_actions.cli.repair import repair
    from pending_actions.cli.serve import serve, token
    from pending_actions.cli.top import top

    for command in (service.up, service.worker, actions.stage, actions.resolve, actions.ls_,
                    actions.show, actions.history, actions.dead, actions.stats,
                    serve, token, top, health, acl, mcp_, mcp_proxy, repair, policy):
        cli.add_command(command)


_register()


def _late_options(command: click.Command) -> None:
    """Give ``command`` (and its subcommands) ``--json`` and ``--redis-url`` too, so they are
    accepted after the subcommand as well as before it."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _late_options(sub)
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}

    def set_json(ctx: click.Context, _p: click.Parameter, value: bool) -> None:
        obj = ctx.find_object(Obj)
        if value and obj is not None:
            obj.as_json = True

    def set_url(ctx: click.Context, _p: click.Parameter, value: str | None) -> None:
        obj = ctx.find_object(Obj)
        if value and obj is not None:
            obj.redis_url = value
            obj.url_given = True

    if "--json" not in taken:
        command.params.append(click.Option(["--json", "late_json"], is_flag=True,
                                           expose_value=False, callback=set_json,
                                           help="Machine-readable JSON output."))
    if "--redis-url" not in taken:
        command.params.append(click.Option(["--redis-url", "late_redis_url"],
                                           expose_value=False, callback=set_url,
                                           help="Redis holding the state."))


for _command in cli.commands.values():
    _late_options(_command)


def main() -> None:
    """The program: one line on stderr for any error, never a traceback."""
    import redis

    from pending_actions.broker.failures import translate

    try:
        cli(prog_name="pending-actions")
    except (PendingActionsError, redis.RedisError) as exc:
        err = translate(exc)  # a raw redis-py error a command let through: ours
        click.echo(f"error: {err}", err=True)
        sys.exit(2 if isinstance(err, InvalidInput | ConfigError) else 1)
    except Exception as exc:  # a bug or an unexpected failure: still one line
        click.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)

