"""A handler's result kept with its session's agent-framework run (``pending_actions.adapters``):
the process that resumes the run, maybe hours later and on another machine, gives the model
what the handler returned, which no other record keeps (the history holds outcomes, not
results)."""

from __future__ import annotations

from pending_actions.broker.models import PendingAction


def keep(action: PendingAction, text: str) -> bool:
    """Keep ``text`` as what applying ``action`` gave; False when its session has no run (it
    was abandoned, or expired). Called from a handler, inside a worker process only: it writes
    with the worker's own connection."""
    # imported here: the actors module builds the worker's context as it loads, which no other
    # process may do (an agent process imports the adapters that call this)
    from pending_actions.workers import actors

    return bool(actors.ctx.scripts.note_outcome(action.session, action_id=action.id,
                                                text=text).run())
