"""``policy set/show/test``: a tenant's policy from the shell (docs/policies.md). Setting one
needs a Redis user that may write the policies (serve's, the auth user, an operator's):
producers and workers may only read them."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import orjson

from pending_actions.broker.errors import Forbidden, PendingActionsError
from pending_actions.broker.models import DEFAULT_TENANT
from pending_actions.broker.policy.rules import Policy, read_document
from pending_actions.cli.base import BadInput, Obj, fail, json_object

TENANT = click.option("--tenant", default=DEFAULT_TENANT, show_default=True,
                      help="The tenant whose policy it is.")


@click.group()
def policy() -> None:
    """A tenant's policy: which staged actions the model may apply, which wait for people
    (and how many), which are refused, which are applied at once (docs/policies.md)."""


@contextlib.contextmanager
def policy_store() -> Iterator[None]:
    """One line, exit 1, for a Redis user that may not write the policies."""
    try:
        yield
    except Forbidden as exc:
        fail(Forbidden(f"{exc}; policies are written by the serve and auth users "
                       "(`pending-actions acl --role auth`)"))


@policy.command(name="set")
@TENANT
@click.argument("file", metavar="FILE")
@click.pass_obj
def set_(obj: Obj, tenant: str, file: str) -> None:
    """Set the policy from FILE (JSON, or YAML with PyYAML installed; - for stdin): checked
    first (an error names the rule and the field; the old policy stays), then kept as a new
    version. Prints the version."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        raise BadInput(f"invalid FILE: cannot read {file}: {exc.strerror}") from None
    try:
        document = read_document(text, "" if file == "-" else file,
                                 obj.settings().max_payload_bytes)
        with policy_store():
            version = obj.client().set_policy(document, tenant=tenant, by="cli")
    except PendingActionsError as exc:
        fail(exc)
    obj.out({"tenant": tenant, "version": version}, f"tenant {tenant}: policy version {version}")


@policy.command()
@TENANT
@click.pass_obj
def show(obj: Obj, tenant: str) -> None:
    """Show the tenant's current policy (its version, when and by whom it was set). Exits 1
    when the tenant has none."""
    try:
        found = obj.client().get_policy(tenant)
    except PendingActionsError as exc:
        fail(exc)
    if found is None:
        click.echo(f"error: tenant {tenant} has no policy", err=True)
        sys.exit(1)
    obj.out(found, f"# version {found['version']}, set by {found.get('by') or '-'}\n"
                   + orjson.dumps(found["document"], option=orjson.OPT_INDENT_2).decode())


@policy.command()
@TENANT
@click.option("--tool", required=True, help="The tool that stages the action.")
@click.option("--apply", "apply_", default="", metavar="HANDLER", help="Its apply handler.")
@click.option("--reject", metavar="HANDLER",
              help="Its reject handler: decided too, and the stricter decision is the action's.")
@click.option("--label", default="", help="Its label.")
@click.option("--session", default="", help="Its session.")
@click.option("--payload", metavar="JSON|@FILE|-", help="Its payload (a JSON object).")
@click.pass_obj
def test(obj: Obj, tenant: str, tool: str, apply_: str, reject: str | None, label: str,
         session: str, payload: str | None) -> None:
    """What the tenant's current policy decides for such an action: the decision, the rule
    that decided, and every other rule that matched with why it lost."""
    data = json_object("--payload", payload) or {}
    try:
        found = obj.client().get_policy(tenant)
    except PendingActionsError as exc:
        fail(exc)
    if found is None:
        obj.out({"decision": "allow", "rule": None, "approvals": 0, "reason": None,
                 "auto": False, "version": None, "matched": []},
                f"allow: tenant {tenant} has no policy")
        return
    explained = Policy(found["document"], found["version"]).explain(
        tool=tool, apply=apply_, label=label, session=session, payload=data, reject=reject)
    v = explained.verdict
    out: dict[str, Any] = {
        "decision": v.decision, "rule": v.rule, "approvals": v.approvals, "reason": v.reason,
        "auto": v.auto, "version": v.version,
        "matched": [{"rule": r.name, "decision": r.decision, "why": why}
                    for r, why in explained.matched]}
    head = v.decision + (f" ({v.approvals} approval(s))" if v.decision == "ask" else "") + \
        (" (auto)" if v.auto else "")
    lines = [f"{head}: {'rule ' + v.rule if v.rule else 'the default (no rule matched)'}"
             f" of version {v.version}" + (f": {v.reason}" if v.reason else "")]
    lines += [f"  also matched {r['rule']} ({r['decision']}): {r['why']}" for r in out["matched"]]
    obj.out(out, "\n".join(lines))
