"""One error hierarchy. Everything the service raises on purpose is a PendingActionsError."""

from __future__ import annotations


class PendingActionsError(Exception):
    """Base of every error this package raises on purpose."""


class ToolError(PendingActionsError):
    """Raised by a handler: its message reaches the model unchanged."""


class Stale(PendingActionsError):
    """Raised by a handler when what the preview was computed from has changed since (see
    ``action.fingerprint``): the action ends with the outcome ``stale``, consumed, and the model
    is told to stage a new preview."""


class InvalidInput(PendingActionsError, ValueError):
    """Input refused before anything changed. ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid {field}: {message}")
        self.field = field
        self.detail = message


class UnknownHandler(InvalidInput):
    """A handler name that no worker has registered."""

    def __init__(self, field: str, name: str) -> None:
        super().__init__(field, f"no live worker has a handler named {name!r}")
        self.name = name


class ConfigError(PendingActionsError):
    """The service is not configured well enough to run."""


class RedisUnavailable(PendingActionsError):
    """Redis could not be reached; nothing was changed by this call."""


class RedisFull(PendingActionsError):
    """Redis is at its memory limit (``maxmemory`` with ``noeviction``) and refused to store
    more; nothing was changed by this call. Work already in flight still ends."""


class Poison(PendingActionsError):
    """A stored record that does not parse (corrupt, or of a key of the wrong type). Workers
    park it (the session's dead letters) and carry on; ``what`` names the kind of record."""

    def __init__(self, what: str, key: str, field: str) -> None:
        super().__init__(f"unreadable {what} at {key} {field}".rstrip())
        self.what, self.key, self.field = what, key, field


class Forbidden(PendingActionsError):
    """Refused by authorization: e.g. staging into a session that belongs to another tenant."""


class ForeignSession(Forbidden):
    """The session belongs to another tenant (its first stage claimed it): nothing was
    changed. Which tenant is not said: the name is theirs."""


class Unowned(Forbidden):
    """A session with keys of its own but no owner record (its field in its partition's
    sessions hash was deleted): no tenant may stage into it, lest another tenant take over
    what it holds. Nothing was changed; an operator restores the record (``repair``)."""


class Damaged(PendingActionsError):
    """Redis holds state the service cannot trust, altered or deleted outside it (an id
    counter set back or lost); refused rather than risk handing out an id twice. The message
    names the key and the mend."""


class Denied(PendingActionsError):
    """A stage a tenant's policy refused: nothing of it is pending, its session's history
    records ``denied``. ``reason`` is the rule's (what the model reads), ``rule`` its name (None:
    the policy's default); with ``stage_many``, ``denied`` lists every denied action ({id, rule,
    reason}) and ``ids`` the ids in the order given, None where denied (the others were
    staged)."""

    def __init__(self, reason: str | None, rule: str | None,
                 denied: list[dict[str, str | None]] | None = None,
                 ids: list[str | None] | None = None, by: str | None = None) -> None:
        # ``by``: what refused it, when no policy did (a handler kept to other tenants)
        by = by or (f"policy rule {rule!r}" if rule else "the policy's default")
        super().__init__(f"Denied: {reason or 'not allowed'} ({by})")
        self.reason, self.rule = reason, rule
        self.denied = denied or []
        self.ids = ids or []


class NotPaused(PendingActionsError):
    """``resume()`` of an agent-framework run found nothing to continue: the session has no
    paused run (never paused, finished, resumed already, or another tenant's: the same
    answer), or ``busy`` another process is continuing it right now (so the run goes on once).
    Nothing was changed."""

    def __init__(self, session: str, busy: bool = False) -> None:
        super().__init__(
            f"session {session!r}: another process is continuing its run" if busy
            else f"session {session!r} has no paused run to resume")
        self.session, self.busy = session, busy
