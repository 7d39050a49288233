"""What each Lua script answers, as a type: the one place that knows the layout of a script's
reply. ``Scripts`` (``broker/atomic/scripts.py``) decodes through these whether a script ran on
its own or on a pipeline, so no caller reads a reply by position.

The status codes are enums whose names the scripts use (``STAGE``, ``TAKE``, ``BEGIN``,
``RECOVER``, ``EXPIRE``; ``source.py`` writes each as its value), so both sides spell them
the same way."""

from __future__ import annotations

import logging
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple, cast

from pydantic import ValidationError

from pending_actions.broker.models import ActionState, Kind, Lease, PendingAction, Spec

log = logging.getLogger("pending_actions")


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class StageRefusal(IntEnum):
    """Why stage.lua refused a session's actions; nothing changed."""

    FOREIGN = -1  # the session belongs to another tenant
    UNOWNED = -2  # no owner record, but keys of its own: its record was lost
    COLLISION = -3  # an id holds another spec already: its partition's counter was set back
    POLICY = -4  # decided by another version of the tenant's policy than the partition's
    FULL = -5  # the session would hold more than MAX_PENDING_PER_SESSION pending actions


class Staged(NamedTuple):
    """stage.lua, for one session's actions: each one's stack depth right after its push (0:
    its id held this very spec already, a retried call whose first try went through), or the
    refusal (``collided``: the id that holds another spec; with POLICY, ``version``: the
    partition's version of the tenant's policy, "" for none; with FULL, ``collided`` is how
    many the session holds)."""

    depths: list[int]
    refused: StageRefusal | None = None
    collided: str = ""
    version: str = ""

    @classmethod
    def decode(cls, raw: Any) -> Staged:
        if raw and int(raw[0]) < 0:
            refused = StageRefusal(int(raw[0]))
            more = _text(raw[1]) if len(raw) > 1 else ""
            if refused is StageRefusal.POLICY:
                return cls([], refused, version=more)
            return cls([], refused, more)
        return cls([int(x) for x in raw])


class SlotChanged(NamedTuple):
    """set_slot.lua and clear_slot.lua: the id the slot held before, if any."""

    previous: str | None

    @classmethod
    def decode(cls, raw: Any) -> SlotChanged:
        return cls(_text(raw) if raw else None)


class Pending(NamedTuple):
    """pending.lua: in-flight actions first, then the stack, head first."""

    actions: list[PendingAction]

    @classmethod
    def decode(cls, raw: Any, session: str) -> Pending:
        """An entry whose spec or counters do not parse is left out (with a warning): the
        worker that takes it parks it in the session's dead letters."""
        out = []
        for i in range(0, len(raw), 4):
            try:
                out.append(PendingAction.build(
                    Spec.read(raw[i + 2], _text(raw[i + 1]), session),
                    ActionState.model_validate_json(raw[i + 3]), _text(raw[i])))
            except ValidationError as exc:
                log.warning("an unreadable pending action left out: %s",
                            exc.errors()[0]["msg"])
        return cls(out)


class Peeked(NamedTuple):
    """peek.lua: what the next resolve would target: the directive, else the stack head's id."""

    directive: Spec | None
    head: str | None

    @classmethod
    def decode(cls, raw: Any, session: str) -> Peeked:
        if not raw:
            return cls(None, None)
        if _text(raw[0]) == "directive":
            return cls(Spec.read(raw[2], _text(raw[1]), session), None)
        return cls(None, _text(raw[1]))


class RunClaim(IntEnum):
    """What claim_run.lua answered; only CLAIMED changed anything (the lease)."""

    CLAIMED = 1  # held by this process now
    NONE = 0  # no paused run in the session (a resume)
    BUSY = -1  # another process holds the run's lease
    PAUSED = -2  # a fresh run in a session whose run is paused: resume that one first
    FOREIGN = -3  # the session or its run is another tenant's


class RunClaimed(NamedTuple):
    """claim_run.lua: the status; when CLAIMED by a resume, the paused run's framework, its
    state, its calls (JSON) and the outcomes workers noted (action id -> result text); with
    BUSY, ``busy_ms``: how long the other process's lease still runs."""

    status: RunClaim
    framework: str = ""
    state: str = ""
    calls: str = "[]"
    outcomes: dict[str, str] = {}  # noqa: RUF012 (a NamedTuple's default, never mutated)
    busy_ms: int = 0

    @classmethod
    def decode(cls, raw: Any) -> RunClaimed:
        status = RunClaim(int(raw[0]))
        if status is RunClaim.BUSY:
            return cls(status, busy_ms=int(raw[1]))
        if status is not RunClaim.CLAIMED:
            return cls(status)
        rest = [_text(x) for x in raw[1:]]
        pairs = rest[3:]
        return cls(status, rest[0], rest[1], rest[2] or "[]",
                   dict(zip(pairs[::2], pairs[1::2], strict=True)))


class TakeStatus(StrEnum):
    OK = "ok"  # a new lease, or the earlier one of a redelivered request no worker started
    NONE = "none"  # nothing to target: take.lua pushed the reply itself
    CONFLICT = "conflict"  # expect_id is not the target: nothing taken, take.lua replied
    DUP = "dup"  # the request was taken before and its lease is started or gone
    NO_WORKER = "no-worker"  # no live worker has the handler the target needs; nothing taken
    # an ask target and no approver (the model's apply): nothing changed, the worker replies
    NEEDS_APPROVAL = "needs-approval"
    # a person's approval recorded (approve.lua; or one given before: ``recorded`` False,
    # nothing changed); more are needed, nothing taken
    APPROVED = "approved"
    # a person's approval counted, not the last one needed: nothing changed; the resolve worker
    # records it with approve.lua (``Taken.basis``: what that re-checks)
    COUNTED = "counted"
    # approve.lua: the action is not as the take that counted the approval saw it; nothing
    # changed, take again
    RETAKE = "retake"
    REVISED = "revised"  # the request's revision is not the target's: nothing changed
    # the request's edit was decided by another version of the tenant's policy than the one
    # in force now: nothing changed (decided again, it might be refused)
    REDECIDE = "redecide"


class Counted(NamedTuple):
    """What take.lua saw when it counted an approval (TAKE.COUNTED), which approve.lua checks
    is still so before it records it: the counters' text ("" for none), the stack's first
    entry, how many stale entries lay above the target, the directive slot ("" for empty), and
    how many approvals the action needs."""

    counters: bytes
    top: str
    skipped: int
    directive: str
    needed: int


class Taken(NamedTuple):
    """take.lua. With OK, the lease: its token is an earlier one when the request was taken
    before (a redelivery), and the number (1-based) of the pool its task went to. With
    NO_WORKER, the target's id and the handler no live pool has ("" when it needs none but
    there is no live pool at all). With NEEDS_APPROVAL, APPROVED, REVISED and REDECIDE, the
    target's id, spec and counters (after the approval), and whether the script changed
    anything (``recorded``: then it acked too); with COUNTED also ``basis``, for approve.lua
    (whose answer is a Taken too)."""

    status: TakeStatus
    id: str = ""
    kind: Kind = "action"
    attempt: int = 0
    deadline: int = 0
    token: str = ""
    pool: int = 0
    handler: str = ""
    spec: Spec | None = None
    counters: ActionState | None = None
    recorded: bool = False
    basis: Counted | None = None

    @classmethod
    def decode(cls, raw: Any, session: str) -> Taken:
        status = TakeStatus(_text(raw[0]))
        if status is TakeStatus.COUNTED:
            action_id = _text(raw[1])
            return cls(status, action_id, spec=Spec.read(raw[2], action_id, session),
                       counters=ActionState.model_validate_json(raw[3]),
                       basis=Counted(raw[4], _text(raw[5]), int(raw[6]), _text(raw[7]),
                                     int(raw[8])))
        if status in (TakeStatus.NEEDS_APPROVAL, TakeStatus.APPROVED, TakeStatus.REVISED,
                      TakeStatus.REDECIDE):
            action_id = _text(raw[1])
            return cls(status, action_id, spec=Spec.read(raw[2], action_id, session),
                       counters=ActionState.model_validate_json(raw[3]),
                       recorded=len(raw) > 4 and _text(raw[4]) == "1")
        if status is TakeStatus.NO_WORKER:
            action_id = _text(raw[1])
            return cls(status, action_id, handler=_text(raw[2]),
                       spec=Spec.read(raw[3], action_id, session))
        if status is not TakeStatus.OK:
            return cls(status)
        _s, action_id, kind, attempt, deadline, token, pool = raw
        return cls(status, _text(action_id), cast(Kind, _text(kind)), int(attempt), int(deadline),
                   _text(token), int(pool))


class BeginStatus(StrEnum):
    OK = "ok"  # this delivery claimed the attempt; run the handler
    STALE = "stale"  # no such lease: recovered, finished, or a take that found nothing
    RUNNING = "running"  # another delivery of the same attempt claimed it first
    GONE = "gone"  # the target's spec was replaced while the task waited


class Begun(NamedTuple):
    """begin.lua. OK carries the lease, the spec and its counters; GONE only the lease."""

    status: BeginStatus
    lease: Lease | None = None
    spec: Spec | None = None
    counters: ActionState | None = None

    @classmethod
    def decode(cls, raw: Any, session: str) -> Begun:
        status = BeginStatus(_text(raw[0]))
        if status is BeginStatus.GONE:
            return cls(status, Lease.model_validate_json(raw[1]))
        if status is not BeginStatus.OK:
            return cls(status)
        lease = Lease.model_validate_json(raw[3])
        return cls(status, lease, Spec.read(raw[1], lease.id, session),
                   ActionState.model_validate_json(raw[2]))


class Renewed(NamedTuple):
    """renew.lua: the lease's new deadline in ms, 0 when the lease is gone."""

    deadline: int

    @classmethod
    def decode(cls, raw: Any) -> Renewed:
        return cls(int(raw))


class Concluded(NamedTuple):
    """finalize.lua and readd.lua: False when the token no longer held the lease (the outcome
    was refused and only written to the history as late-refused)."""

    recorded: bool

    @classmethod
    def decode(cls, raw: Any) -> Concluded:
        return cls(bool(int(raw)))


class RecoverOutcome(IntEnum):
    GONE = 0  # no such lease: finished or recovered already
    RETURNED = 1  # its worker was lost mid-handler: back where it was, stalls + 1
    DEAD_LETTERED = 2  # lost max_stalls times: moved to the dead-letter list
    UNSTARTED = 3  # no worker started it in time: back where it was, no stall
    LIVE = 4  # renewed meanwhile: nothing done, look again at the deadline


class Recovered(NamedTuple):
    """recover.lua: what became of the lease, and its deadline (the one to look again at when
    LIVE)."""

    outcome: RecoverOutcome
    deadline: int

    @classmethod
    def decode(cls, raw: Any) -> Recovered:
        return cls(RecoverOutcome(int(raw[0])), int(raw[1]))


class ExpireOutcome(IntEnum):
    ENDED = 0  # past its ttl and stacked: ended as expired
    GONE = 1  # resolved or ended already: nothing to do
    IN_FLIGHT = 2  # taken before its ttl passed: its attempt decides; look again later
    LATER = 3  # not due yet (the index entry was early): look again at the time given


class Expiry(NamedTuple):
    """expire.lua: what became of the action, when to look again (LATER), and the spec it
    ended (ENDED)."""

    outcome: ExpireOutcome
    at: int
    spec: bytes | None = None

    @classmethod
    def decode(cls, raw: Any) -> Expiry:
        return cls(ExpireOutcome(int(raw[0])), int(raw[1]), raw[2] if len(raw) > 2 else None)
