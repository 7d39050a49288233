"""Commands that talk to the service: stage, resolve, and the views of what is pending."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import get_args

import click
import orjson
from click.core import ParameterSource

from pending_actions.broker.errors import ForeignSession, PendingActionsError
from pending_actions.broker.models import DEFAULT_TENANT, PendingAction, ResolveAction, Result
from pending_actions.cli.base import SESSION, Obj, fail, json_object


@click.command()
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
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True,
              help="The tenant the session belongs to (its first stage claims it).")
@click.pass_obj
def stage(obj: Obj, session: str, tool: str, label: str, apply_: str, reject: str | None,
          payload: str | None, ttl: float | None, fingerprint: str | None,
          schema: str | None, tenant: str) -> None:
    """Stage a pending action on top of SESSION's stack; prints its id."""
    data = json_object("--payload", payload)
    try:
        action_id = obj.client().stage(session=session, tool=tool, label=label, apply=apply_,
                                       reject=reject, payload=data, ttl=ttl,
                                       fingerprint=fingerprint,
                                       schema=json_object("--schema", schema), tenant=tenant)
    except ForeignSession as exc:
        # the usual cause: a session a stage with --tenant claimed, staged into without it
        given = click.get_current_context().get_parameter_source("tenant")
        fail(exc if given is not ParameterSource.DEFAULT else ForeignSession(
            f"{exc}; without --tenant a stage is for tenant {tenant!r}: pass --tenant with "
            "the session's tenant"))
    except PendingActionsError as exc:
        fail(exc)
    obj.out({"id": action_id}, action_id)


@click.command()
@SESSION
@click.option("--action", required=True, type=click.Choice(get_args(ResolveAction)))
@click.option("--reason", required=True, help="Why; passed to the handler.")
@click.option("--extra", metavar="JSON|@FILE|-", help="JSON object passed through untouched.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="How long to wait for the outcome [default: settings, 60].")
@click.option("--edit", metavar="JSON|@FILE|-",
              help="With apply: a JSON Merge Patch for the payload, checked against its schema.")
@click.option("--expect-id", metavar="ID", help="Go through only if ID is the target.")
@click.option("--approver", metavar="NAME",
              help="A person's resolve: their approval of an action a policy asks people for.")
@click.pass_obj
def resolve(obj: Obj, session: str, action: ResolveAction, reason: str, extra: str | None,
            timeout: float | None, edit: str | None, expect_id: str | None,
            approver: str | None) -> None:
    """Apply or discard SESSION's current target (directive, newest action, or standing
    handler) and print the outcome. Exits 1 when the outcome is an error."""
    from pending_actions.producers import render

    data = json_object("--extra", extra)
    patch = json_object("--edit", edit)
    try:
        result: Result = obj.client().resolve(session=session, action=action, reason=reason,
                                              extra=data, timeout=timeout, edit=patch,
                                              expect_id=expect_id, approver=approver)
    except PendingActionsError as exc:
        fail(exc)
    obj.out(result.model_dump(), render(result))
    sys.exit(1 if result.is_error else 0)


def _line(a: PendingAction) -> str:
    err = f"  last_error={a.last_error!r}" if a.last_error else ""
    return f"{a.id}  {a.state}  attempts={a.attempts}  {a.label}{err}"


ANY_SESSION = click.option("--session", metavar="SESSION", help="One session (or --all).")
ALL = click.option("--all", "all_", is_flag=True, help="Every session (HSCAN, never KEYS).")
TENANT = click.option("--tenant", help="With --all: only this tenant's sessions.")
UNOWNED = click.option(
    "--unowned", is_flag=True, help="With --all: also the sessions that have keys but no owner "
    "record, marked (unowned); SCANs the key space, as an operator's Redis user (not a "
    "producer's) may.")


def _one_or_all(session: str | None, all_: bool, tenant: str | None = None,
                unowned: bool = False) -> None:
    if bool(session) == all_:
        raise click.UsageError("give either --session SESSION or --all")
    if unowned and (not all_ or tenant):
        raise click.UsageError("--unowned goes with --all, without --tenant (no tenant owns "
                               "those sessions)")


@click.command(name="ls")
@ANY_SESSION
@ALL
@TENANT
@UNOWNED
@click.pass_obj
def ls_(obj: Obj, session: str | None, all_: bool, tenant: str | None, unowned: bool) -> None:
    """List pending actions of SESSION (in-flight first, then the stack, head first), or with
    --all of every session whose owner record names a tenant (with --tenant, that one), newest
    first."""
    from pending_actions.views import UNOWNED as LOST
    from pending_actions.views import listed

    _one_or_all(session, all_, tenant, unowned)
    try:
        pa = obj.client()
        sessions = [(session, "")] if session else listed(pa, tenant, "actions", unowned)
        items = [(owner == LOST, a) for s, owner in sessions for a in pa.pending(s)]
    except PendingActionsError as exc:
        fail(exc)
    if all_:
        items.sort(key=lambda x: x[1].created_at, reverse=True)
    obj.out([{**a.model_dump(), **({"unowned": True} if lost else {})} for lost, a in items],
            "\n".join((f"{a.session}{' ' + LOST if lost else ''}  " if all_ else "")
                      + _line(a) for lost, a in items)
            or "(nothing pending)")


@click.command()
@SESSION
@click.argument("action_id", metavar="ID")
@click.pass_obj
def show(obj: Obj, session: str, action_id: str) -> None:
    """Show one pending action (or the directive / standing handler) of SESSION in full:
    payload, attempts, last error and whether it is in flight. Exits 1 if ID is not there."""
    try:
        found = obj.client().show(session, action_id)
    except PendingActionsError as exc:
        fail(exc)
    if found is None:
        click.echo(f"error: {action_id} is not pending in session {session}", err=True)
        sys.exit(1)
    obj.out(found.model_dump(),
            orjson.dumps(found.model_dump(), option=orjson.OPT_INDENT_2).decode())


@click.command()
@SESSION
@click.option("--count", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_obj
def history(obj: Obj, session: str, count: int) -> None:
    """Print SESSION's history: every stage, take, outcome and recovery."""
    try:
        events = obj.client().history(session, count)
    except PendingActionsError as exc:
        fail(exc)
    obj.out([{"time": _when(e["at"]), **e} for e in events],
            "\n".join(_event_line(e) for e in events) or "(no history)")


def _when(ms: str) -> str:
    """A stream id or a time in ms, as local time to the millisecond."""
    stamp = datetime.fromtimestamp(int(ms.split("-")[0]) / 1000).astimezone()
    return stamp.isoformat(sep=" ", timespec="milliseconds")


def _event_line(event: dict[str, str]) -> str:
    rest = {k: _when(v) if k == "expires_at" else v for k, v in event.items()
            if k not in ("at", "event")}
    if rest.get("rule") == "":  # the entry's word for "no rule matched": the policy's default
        rest["rule"] = "(default)"
    return f"{_when(event['at'])}  {event['event']:<13} " + "  ".join(
        f"{k}={v}" for k, v in rest.items())


@click.command()
@ANY_SESSION
@ALL
@TENANT
@UNOWNED
@click.pass_obj
def dead(obj: Obj, session: str | None, all_: bool, tenant: str | None, unowned: bool) -> None:
    """List dead-lettered actions with the reason, of SESSION or with --all of every session."""
    from pending_actions.views import dead_all

    _one_or_all(session, all_, tenant, unowned)
    try:
        pa = obj.client()
        items = ([{"session": session, **d} for d in pa.dead_letters(session)] if session
                 else dead_all(pa, tenant, unowned))
    except PendingActionsError as exc:
        fail(exc)
    obj.out(items, "\n".join(f"{d['session']}{' (unowned)' if d.get('unowned') else ''}  "
                              f"{d['id']}  {d['reason']}" for d in items)
            or "(none)")


@click.command()
@click.pass_obj
def stats(obj: Obj) -> None:
    """Deployment-wide figures as a table: sessions, pending / in flight / dead (by tenant and
    tool), the oldest pending age, requests and tasks waiting, leases (and overdue ones),
    registered handlers."""
    from pending_actions.cli.top import stats_text
    from pending_actions.views import figures

    try:
        data = figures(obj.client())
    except PendingActionsError as exc:
        fail(exc)
    obj.out(data.as_dict(), stats_text(data))

