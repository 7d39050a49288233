"""Every event name written to a stream, in one place.

``Event`` is what a session's history stream (``pa:{S}:history``) records. The Lua scripts get
it as the table ``EVENT`` (each name written as its value, ``broker/atomic/source.py``),
so a script names an event as ``EVENT.TAKEN`` and an unknown name fails the script.
``WorkerEvent`` is what the lifecycle stream ``pa:workers`` records, each entry written by
``announce``.

Each event also says what it means for its action (``Fate``), so that whoever counts outcomes
(``serve``'s metrics, the soak's tally) derives them from here: a new outcome is one member."""

from __future__ import annotations

import os
from enum import Enum, StrEnum
from typing import Any

from pending_actions.broker.keys import Keys


class Fate(Enum):
    """What an event means for the action it names."""

    NONE = "none"  # no outcome: a stage, a take, a recovery, a slot's change, a parked record
    RETRY = "retry"  # an attempt's outcome that leaves the action to be resolved again
    END = "end"  # the action is over: consumed, expired or dead-lettered; nothing follows


class Event(StrEnum):
    fate: Fate

    def __new__(cls, value: str, fate: Fate = Fate.NONE) -> Event:
        member = str.__new__(cls, value)
        member._value_ = value
        member.fate = fate
        return member

    STAGED = "staged"  # stage.lua: a new action went on its session's stack head
    DIRECTIVE_SET = "directive-set"  # set_slot.lua: a directive was set (replacing any other)
    STANDING_SET = "standing-set"  # set_slot.lua: a standing handler was set
    DIRECTIVE_CLEARED = "directive-cleared"  # clear_slot.lua
    STANDING_CLEARED = "standing-cleared"  # clear_slot.lua
    TAKEN = "taken"  # take.lua: a resolve leased its target to a new attempt
    APPLIED = "applied", Fate.END  # finalize.lua: the apply handler returned; consumed
    DISCARDED = "discarded", Fate.END  # finalize.lua: the discard went through; consumed
    # readd.lua: the handler raised; pending again (a directive is used up all the same, but
    # counted as a failure, not as an end)
    FAILED = "failed", Fate.RETRY
    # finalize/readd.lua: an outcome came after its lease ended; not recorded, and a reader of
    # the feed, where that outcome was already published, counts it back out
    LATE_REFUSED = "late-refused", Fate.RETRY
    RECOVERED = "recovered"  # recover.lua: a lease expired; the target went back
    DEAD_LETTERED = "dead-lettered", Fate.END  # recover.lua: lost max_stalls times; dead list
    PARKED = "parked"  # park.lua: a record that does not parse moved to the dead list, raw
    EXPIRED = "expired", Fate.END  # expire.lua or take.lua: past its ttl; no handler ran
    STALE = "stale", Fate.END  # finalize.lua: the handler raised Stale; consumed, not applied
    # stage.lua: a policy rule denied the action; nothing was staged (it never was pending)
    DENIED = "denied", Fate.END
    # approve.lua: a person's approval, counted by take.lua, of an ask action that needs more;
    # it stays pending
    APPROVED = "approved"

    @property
    def ends(self) -> bool:
        """The action is over with this event."""
        return self.fate is Fate.END

    @property
    def is_outcome(self) -> bool:
        """An attempt's or the recovery's verdict on the action, final or not."""
        return self.fate is not Fate.NONE


# in the enum's order; as strings, a stream entry's event name is found in them as it is
OUTCOMES: tuple[Event, ...] = tuple(e for e in Event if e.is_outcome)
ENDINGS: frozenset[Event] = frozenset(e for e in Event if e.ends)


class WorkerEvent(StrEnum):
    READY = "ready"  # a resolve worker or a dramatiq worker process is serving
    STOPPING = "stopping"  # a dramatiq worker process is shutting down


def announce(client: Any, keys: Keys, role: str, event: str, **fields: str | int) -> None:
    """One entry on the lifecycle stream (``Keys.workers``), capped: this process (its pid) in
    ``role`` says ``event`` (a ``WorkerEvent``, or a failpoint's name), with ``fields``."""
    client.xadd(keys.workers, {"role": role, "event": event, "pid": os.getpid(), **fields},
                maxlen=1000, approximate=True)
