"""Every text the MCP servers show a model beside ``resolve``'s own (``broker/texts.py``, and
its tool definition and rendering in ``producers/tool.py``)."""

from __future__ import annotations

PENDING_DESCRIPTION = (
    "Lists this session's pending actions: staged previews that have not been applied yet, "
    "newest first. `resolve` applies or discards the first one listed. Call it when a tool "
    "result says that something was staged or that a preview is pending, and before `resolve` "
    "when you are not sure which action it would take."
)

NOTHING_PENDING = "Nothing is pending in this session."


def instructions(session: str | None) -> str:
    where = f"session {session}" if session else "the session your connection names"
    return (f"pending-actions for {where}. A tool call that would change something may be "
            "staged as a pending action instead of run: nothing happens until `resolve` "
            "applies it (or discards it). `pending` lists what is waiting.")


def staged(action_id: str, tool: str) -> str:
    """An upstream call decided ``ask``: staged, not run."""
    return (f"Staged {action_id}: {tool} was not run, nothing has happened yet. Call `resolve` "
            "with action \"apply\" to run it, or \"discard\" to drop it.")


def denied(reason: str, rule: str | None) -> str:
    by = f" by policy rule {rule}" if rule else ""
    return f"Denied{by}: {reason}. Nothing was run."


def not_staged(why: str) -> str:
    return f"{why}. Nothing was run or staged."


def unknown_tool(name: str) -> str:
    return f"Unknown tool: {name}"


def more_pending(count: int) -> str:
    return (f"… and {count} more (older, listed here once the ones above are resolved)")


def no_session(header: str) -> str:
    return f"No session: send the {header} header (or start the server with --session)."
