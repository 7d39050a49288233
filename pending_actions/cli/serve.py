"""``serve`` and ``token``: the commands of the people-facing layer. The web stack is imported
only by ``serve`` itself, so the rest of the CLI works without the ``serve`` extra."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import click

from pending_actions.broker import tracing
from pending_actions.broker.errors import (
    ConfigError,
    Forbidden,
    InvalidInput,
    PendingActionsError,
)
from pending_actions.broker.models import check_tenant
from pending_actions.broker.settings import page_address
from pending_actions.cli.base import Obj, fail
from pending_actions.serve.auth import ROLES, Tokens


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--resolve-timeout", type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="Longest wait of one resolve [default: settings, 60].")
@click.option("--metrics-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Also serve every tenant's /metrics, with no token, on this port "
                   "(for the operators' monitoring; off by default).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address of the --metrics-port listener.")
@click.option("--first-token", "first_tenant", metavar="TENANT",
              help="On the deployment's first start only, create an admin token of TENANT and "
                   "print it once on stdout; later starts say it was made.")
@click.pass_obj
def serve(obj: Obj, host: str, port: int, resolve_timeout: float | None,
          metrics_port: int | None, metrics_host: str, first_tenant: str | None) -> None:
    """Run the HTTP API and the approval inbox page (needs `pip install 'pending-actions[serve]'`).

    Every /v1 route and /metrics need `Authorization: Bearer <token>` (see `token create`);
    /healthz does not. /metrics shows the token's tenant only; the deployment's figures, every
    tenant's, are on --metrics-port. Open http://HOST:PORT/ in a browser for the inbox."""
    try:
        from pending_actions.serve import listen
        from pending_actions.serve.app import create_app, operator_app
    except ImportError as exc:
        raise click.UsageError(f"serve needs the 'serve' extra ({exc.name} is missing): "
                               "pip install 'pending-actions[serve]'") from None
    if metrics_port is not None and metrics_port == port and metrics_host == host:
        raise click.UsageError("--metrics-port must differ from --port")
    try:
        if first_tenant is not None:
            check_tenant(first_tenant)  # before the ports are taken
        sock = listen.bind(host, port)
        side = None if metrics_port is None else listen.bind(metrics_host, metrics_port)
    except (ConfigError, InvalidInput) as exc:
        fail(exc)
    tracing.setup("pending-actions-serve")  # from the OTEL_* variables alone
    pa = obj.client()
    if first_tenant is not None:
        first_token(pa, first_tenant)
    app = create_app(pa, resolve_timeout)
    click.echo(f"serving on http://{host}:{port}/", err=True)
    if side is not None:
        click.echo(f"operator metrics on http://{metrics_host}:{metrics_port}/metrics",
                   err=True)
    listen.run(app, sock, None if side is None else (operator_app(app.state.api), side),
               listen.Limits.of(app.state.api.settings))


def first_token(pa: Any, tenant: str) -> None:
    """``--first-token``: a compose deployment's way in without a shell in a container."""
    try:
        with token_store():
            secret, name = Tokens(pa.client, pa.ctx.keys).first(tenant)
    except PendingActionsError as exc:
        fail(exc)
    if secret is not None:
        click.echo(f"first admin token for tenant {tenant} (shown once): {secret}")
        # as `token create` prints one: the inbox opened signed in (INBOX_URL)
        click.echo(f"sign-in link (as secret as the token): {pa.settings.inbox_url}"
                   f"#token={secret}")
    else:
        click.echo(f"the first admin token was made before ({name}); more with "
                   "`pending-actions token create`", err=True)


@click.group()
def token() -> None:
    """Bearer tokens for `serve`: each bound to a tenant and a role. Run as the auth Redis
    user (`pending-actions acl --role auth`) or serve's: no other role reaches tokens."""


@contextlib.contextmanager
def token_store() -> Iterator[None]:
    """One line, exit 1, for a Redis user that may not reach the token store."""
    from pending_actions.broker.failures import redis_errors

    try:
        with redis_errors():
            yield
    except Forbidden as exc:
        fail(Forbidden(f"{exc}; tokens are reachable only by the auth and serve users "
                       "(`pending-actions acl --role auth`)"))


def _inbox_url(_ctx: click.Context, _p: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else page_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@token.command()
@click.option("--tenant", required=True, help="The tenant whose sessions the token sees.")
@click.option("--role", required=True, type=click.Choice(ROLES),
              help="producer: stage; approver: read and resolve; admin: both, and /metrics.")
@click.option("--name", help="A name to revoke it by and to record as `by` [default: generated].")
@click.option("--inbox-url", callback=_inbox_url,
              help="Where serve's inbox page is, for the sign-in link printed with an approver "
                   "or admin token [env PENDING_ACTIONS_INBOX_URL; default "
                   "http://127.0.0.1:8080/].")
@click.pass_obj
def create(obj: Obj, tenant: str, role: str, name: str | None, inbox_url: str | None) -> None:
    """Create a token and print it. It is shown this once: Redis keeps only its hash.

    An approver or admin token also gets a sign-in link, INBOX_URL#token=TOKEN (on stderr;
    `link` with --json): it opens the inbox signed in. The token rides in the fragment, which a
    browser never sends to a server; the page takes it out of the address at once. The link is
    the token itself: hand it over as you would the token."""
    pa = obj.client()  # (a bad PENDING_ACTIONS_INBOX_URL is refused here, before a token)
    page = inbox_url or pa.settings.inbox_url
    try:
        with token_store():
            secret, who = Tokens(pa.client, pa.ctx.keys).create(tenant, role, name)
    except PendingActionsError as exc:
        fail(exc)
    # a producer's token is a program's: it has no page to open
    link = f"{page}#token={secret}" if who.may("approver") else None
    obj.out({"token": secret, **asdict(who), **({"link": link} if link else {})}, secret)
    if not obj.as_json:
        click.echo(f"name={who.name} tenant={who.tenant} role={who.role} "
                   "(shown once; store it now)", err=True)
        if link:
            click.echo(f"sign-in link (as secret as the token): {link}", err=True)


@token.command()
@click.argument("name")
@click.pass_obj
def revoke(obj: Obj, name: str) -> None:
    """Revoke the token called NAME: its next request is refused (401). Exits 1 if unknown."""
    pa = obj.client()
    with token_store():
        done = Tokens(pa.client, pa.ctx.keys).revoke(name)
    obj.out({"revoked": done, "name": name}, f"revoked {name}" if done else f"no token {name}")
    sys.exit(0 if done else 1)


@token.command(name="ls")
@click.pass_obj
def list_(obj: Obj) -> None:
    """List tokens: name, tenant, role (never the token)."""
    pa = obj.client()
    with token_store():
        items = Tokens(pa.client, pa.ctx.keys).all()
    obj.out([asdict(p) for p in items],
            "\n".join(f"{p.name}  tenant={p.tenant}  role={p.role}" for p in items) or "(none)")
