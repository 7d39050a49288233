"""Every event name written to a stream, in one place.

``Event`` is what a session's history stream (``pa:{S}:history``) records. The Lua scripts get
it as the table ``EVENT`` (generated from this enum into the prelude, see ``broker/scripts.py``),
so a script names an event as ``EVENT.TAKEN`` and an unknown name fails the script.
``WorkerEvent`` is what the lifecycle stream ``pa:workers`` records."""

from __future__ import annotations

from enum import StrEnum


class Event(StrEnum):
    STAGED = "staged"  # stage.lua: a new action went on its session's stack head
    DIRECTIVE_SET = "directive-set"  # set_slot.lua: a directive was set (replacing any other)
    STANDING_SET = "standing-set"  # set_slot.lua: a standing handler was set
    DIRECTIVE_CLEARED = "directive-cleared"  # clear_slot.lua
    STANDING_CLEARED = "standing-cleared"  # clear_slot.lua
    TAKEN = "taken"  # take.lua: a resolve leased its target to a new attempt
    APPLIED = "applied"  # finalize.lua: the apply handler returned; the action is consumed
    DISCARDED = "discarded"  # finalize.lua: the discard went through; the action is consumed
    FAILED = "failed"  # readd.lua: the handler raised; pending again (a directive: consumed)
    LATE_REFUSED = "late-refused"  # finalize/readd.lua: an outcome came after its lease ended
    RECOVERED = "recovered"  # recover.lua: a lease expired; the target went back
    DEAD_LETTERED = "dead-lettered"  # recover.lua: lost max_stalls times; moved to the dead list
    PARKED = "parked"  # park.lua: a record that does not parse moved to the dead list, raw
    EXPIRED = "expired"  # expire.lua or take.lua: past its ttl, ended unresolved; no handler ran
    STALE = "stale"  # finalize.lua: the handler raised Stale; consumed, nothing applied


class WorkerEvent(StrEnum):
    READY = "ready"  # a resolve worker or a dramatiq worker process is serving
    SERVING = "serving"  # a dramatiq worker process serves resolve requests (workers/local.py)
    STOPPING = "stopping"  # a dramatiq worker process is shutting down
