"""Every text a result or an action's ``last_error`` carries to the model, in one place: the
resolve worker, the handler tasks, recovery and the producer's timeout all take theirs from
here. (The tool's own definition, its intent line and the rendering for people are in
``producers/tool.py``.) ``action`` is ``"apply"`` or ``"discard"`` throughout."""

from __future__ import annotations

from typing import Any

REMINDER = (
    "<system-reminder>\n"
    "This is a preview. Call the `resolve` tool to apply or discard these changes.\n"
    "</system-reminder>"
)

NOTHING_TO_APPLY = "No pending action to resolve. Nothing to apply or discard."
NOTHING_TO_DISCARD = "Nothing to discard; no pending action remains."
REPLACED = "The target was replaced before it ran; nothing was done."


def _verb(action: str) -> str:
    return "Apply" if action == "apply" else "Discard"


def done(action: str, label: str, reason: str) -> str:
    """A handler returned None (or a discard has no reject handler)."""
    return f"{'Applied' if action == 'apply' else 'Discarded'}: {label}. Reason: {reason}"


def handler_failed(action: str, message: str) -> str:
    """A handler raised something other than ToolError: a failed discard passes it as is."""
    return f"Apply failed: {message}" if action == "apply" else message


def worker_lost(action: str, attempt: int, action_id: str) -> str:
    return (f"{_verb(action)} interrupted: the worker running attempt {attempt} of {action_id} "
            "was lost. The action is pending again; retry or discard it.")


def never_started(action: str, attempt: int, action_id: str) -> str:
    return (f"{_verb(action)} interrupted: no worker started attempt {attempt} of {action_id} "
            "in time. The action is pending again; retry or discard it.")


def dead_lettered(action: str, action_id: str, stalls: int) -> str:
    return (f"{_verb(action)} failed: {action_id} was moved to the dead-letter list after its "
            f"worker was lost {stalls} times.")


def parked(why: object) -> str:
    """A record the resolve needed does not parse: moved aside (park.lua), nothing run."""
    return f"Could not resolve: {why}; it was moved to the session's dead letters"


def spec_missing(action: str, action_id: str) -> str:
    """An action whose spec was gone when it was to run or go back: dead-lettered."""
    return (f"{_verb(action)} failed: {action_id} was moved to the dead-letter list: its "
            "record (spec) is missing.")


def no_worker(action: str, action_id: str, name: str | None) -> str:
    """No live worker has the handler the target needs: nothing was taken."""
    needs = f"its handler {name!r}" if name else "any handler"
    return (f"{_verb(action)} refused: no live worker has {needs} for {action_id}. The action "
            "stays pending; start a worker that has it, or discard the action.")


def not_the_target(expect_id: str) -> str:
    """resolve(expect_id=...) when that id is not what a resolve would take now."""
    return (f"expect_id: {expect_id} is not the current target (it was resolved, or something "
            "newer is on top); nothing was changed.")


def expired(expect_id: str) -> str:
    """resolve(expect_id=...) naming an action that passed its ttl."""
    return (f"Expired: {expect_id} passed its ttl and ended unresolved (expect_id); nothing was "
            "changed. Stage a new preview if the change is still wanted.")


def stale(message: str) -> str:
    """The handler raised Stale: the action is consumed; the model must preview again."""
    return (f"Stale: {message}. The preview was computed from something that has changed "
            "since; nothing was applied. Stage a new preview.")


def timed_out(wait: float) -> str:
    return (f"Timed out after {wait:g}s waiting for the resolve to finish. The action is still "
            "applied, discarded or pending, never lost: check `pending-actions ls`.")


# an action's last_error after recovery returned it
def worker_lost_error(attempt: int) -> str:
    return f"worker lost during attempt {attempt}"


def never_started_error(attempt: int) -> str:
    return f"no worker started attempt {attempt}"


# --- policies and people ---------------------------------------------------------------------
def auto_reason(rule: str) -> str:
    """The reason an action applied by its policy (``auto``) gives its handler."""
    return f"allowed by policy rule {rule!r}, applied automatically"


def needs_approval(action_id: str, label: str, rule: str | None, tenant: str, need: int,
                   approved_by: list[str], action: str = "apply") -> str:
    """The model's apply of an action its policy reserves for people (``ask``), or its discard
    when that runs the action's reject handler (decided by the same policy)."""
    by = f"policy rule {rule!r}" if rule else "the policy's default"
    so_far = f" ({len(approved_by)} given: {', '.join(approved_by)})" if approved_by else ""
    if action == "apply":
        what, end = f"{label} ({action_id}) is", "Nothing was changed; you may discard it."
    else:
        what, end = (f"discarding {label} ({action_id}) runs its reject handler, which is",
                     "Nothing was changed.")
    return (f"Needs approval: {what} reserved for people by {by}. It needs "
            f"{need - len(approved_by)} more approval(s) of {need}{so_far}, from people of "
            f"tenant {tenant!r}, in the approval inbox. {end}")


def handler_kept(name: str, tenant: str) -> str:
    """A stage naming a handler the workers keep to other tenants (``--mcp-upstream-tenants``,
    ``@handler(name, tenants=...)``): which ones is not said (their names are theirs)."""
    return f"handler {name} does not serve tenant {tenant!r}"


def slot_needs_people(slot: str, approvals: int) -> str:
    """A directive or standing handler whose policy asks people: the model's resolve applies a
    slot, so it cannot be one."""
    return (f"it needs {approvals} person's approval(s), and a {slot} is applied by the model's "
            "own resolve: stage it as an action instead")


def approved(k: int, n: int, approved_by: list[str], again: str | None,
             action: str = "apply") -> str:
    """A person's approval that was not the last one needed (``again``: the approver, who had
    approved already: it counts once), of an apply or of a discard that runs the reject
    handler."""
    first = f"{again} had approved already. " if again else ""
    done = "applied" if action == "apply" else "discarded (its reject handler run)"
    return (f"Approved {k} of {n}: {', '.join(approved_by)}. {first}It waits for {n - k} more "
            f"approval(s) before it is {done}.")


def edit_stricter(action_id: str, verdict: Any, staged: dict[str, Any]) -> str:
    """An edit that the tenant's policy decides more strictly than the action it edits
    (``verdict``: broker/policy/rules.py Verdict; ``staged``: the action's policy as staged)."""
    def said(decision: str | None, approvals: int, rule: str | None) -> str:
        what = "allow" if decision is None else decision
        if what == "ask":
            what += f" ({approvals} approval(s))"
        return what + (f" by rule {rule!r}" if rule else " by the default" if decision else "")

    now = said(verdict.decision, verdict.approvals, verdict.rule)
    before = said(staged.get("decision"), int(staged.get("approvals") or 0), staged.get("rule"))
    return (f"the edited payload of {action_id} is decided {now}, stricter than it was staged "
            f"with ({before}); nothing was changed: stage the edited action anew instead")


def policy_changed(action_id: str) -> str:
    """An edit decided by a version of the tenant's policy that changed before it was taken."""
    return (f"edit: the tenant's policy changed while the edit of {action_id} was decided; "
            "nothing was changed: resolve again, and it is decided by the policy in force")


def revised(action_id: str, seen: int | None, current: int) -> str:
    """resolve(revision=...) of an action people edited since."""
    return (f"revision: {action_id} is at revision {current} (people edited its payload), not "
            f"{seen}; nothing was changed. Look at it again before you decide.")
