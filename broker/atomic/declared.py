"""Each script's header, read once at import: the one declaration of its name, its Redis 7
flags, the roles whose Redis users may run it, its KEYS and its ARGV. Everything else about a
script's slots is derived from it: the ``local`` lines that name them in the text Redis runs
(``source.py``), the tuple each call builds (``KEYS``/``ARGV`` here), the scripts of each
role's ACL rules (``pending_actions/cli/acl.py``).

A header, as ``lua/take.lua`` begins::

    -- name: take
    -- What the operation does atomically, and why (one paragraph or more).
    -- flags: none                       (or no-writes, allow-oom, or both)
    -- roles: worker                     (producer, worker, serve, auth)
    -- KEYS
    --   directive   (string)            a slot: three spaces, its name, what it holds
    --   ...streams  one per live pool   a tail of any length, always the last
    -- ARGV
    --   req         request id
    -- Returns: ...

A slot is named by its local in the script (``directive``); a tail ``...streams`` by the local
``streams_at``, the number of its first slot. A header that does not parse is refused when
this module is imported, naming its file and line (``BadHeader``), never when Redis runs it."""

from __future__ import annotations

import keyword
import re
from collections import namedtuple
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

ROLES = ("producer", "worker", "serve", "auth")
# Redis 7's script flags: no-writes for a read-only script (Redis runs it on a replica, and
# while full); allow-oom for one that must run while Redis is full (it finishes work already
# started, or says a worker lives). A script with neither starts or adds work: refused,
# before it runs, while Redis is full.
FLAGS = ("no-writes", "allow-oom")
# a slot's name is a Lua local and a Python keyword argument: neither language's keywords
LUA_KEYWORDS = frozenset((
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"))
SLOT = re.compile(r"^--   (\.\.\.)?(\w+)(?:\s{2,}(.*)|\s*)$")


class BadHeader(ValueError):
    """A script's header that does not say what it must, at ``path:line``."""

    def __init__(self, path: str, line: int, why: str) -> None:
        super().__init__(f"{path}:{line}: {why}")


@dataclass(frozen=True)
class Declared:
    """One script as its header declares it. ``keys``/``argv``: the fixed slots' names, in
    slot order; ``keys_tail``/``argv_tail``: the tail's name ("" for none)."""

    name: str
    about: str
    flags: tuple[str, ...]
    roles: tuple[str, ...]
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    keys_tail: str = ""
    argv_tail: str = ""

    def locals(self) -> str:
        """The Lua lines that name every slot, as the script's code reads them."""
        out = []
        for table, names, tail in (("KEYS", self.keys, self.keys_tail),
                                   ("ARGV", self.argv, self.argv_tail)):
            if names:
                slots = ", ".join(f"{table}[{i}]" for i in range(1, len(names) + 1))
                out.append(f"local {', '.join(names)} = {slots}\n")
            if tail:
                out.append(f"local {tail}_at = {len(names) + 1}\n")
        return "".join(out)


def lua_file(name: str) -> str:
    """The text of ``lua/<name>.lua``, from the installed package (a wheel or a checkout)."""
    return (resources.files("pending_actions.broker.atomic") / "lua" / f"{name}.lua").read_text()


def parse(path: str, text: str) -> Declared:
    """The header of the script at ``path`` (``lua/<name>.lua``), whose text is ``text``."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if not line.startswith("--")), len(lines))
    at = 0

    def bad(why: str) -> BadHeader:
        return BadHeader(path, at + 1, why)

    def take(prefix: str) -> str:
        nonlocal at
        if at >= end or not lines[at].startswith(prefix):
            raise bad(f"expected a line starting {prefix!r}")
        at += 1
        return lines[at - 1][len(prefix):].strip()

    stem = path.rsplit("/", 1)[-1].removesuffix(".lua")
    name = take("-- name:")
    if name != stem:
        at -= 1
        raise bad(f"name {name!r} is not the file's ({stem!r})")
    about = []
    while at < end and not lines[at].startswith("-- flags:"):
        about.append(lines[at][2:].strip())
        at += 1
    if not "".join(about):
        raise bad("no paragraph on what the operation does")
    flags = tuple(f.strip() for f in take("-- flags:").split(","))
    if flags == ("none",):
        flags = ()
    for flag in flags:
        if flag not in FLAGS:
            at -= 1
            raise bad(f"unknown flag {flag!r} (none, or of {', '.join(FLAGS)})")
    roles = tuple(r.strip() for r in take("-- roles:").split(","))
    for role in roles:
        if role not in ROLES:
            at -= 1
            raise bad(f"unknown role {role!r} (of {', '.join(ROLES)})")
    found: dict[str, tuple[list[str], str]] = {}
    seen: set[str] = set()
    for table in ("KEYS", "ARGV"):
        if take("--") != table:
            at -= 1
            raise bad(f"expected '-- {table}'")
        names, tail = [], ""
        while at < end and lines[at].startswith("--   "):
            if lines[at].startswith("--    "):  # a description's next line
                at += 1
                continue
            slot = SLOT.match(lines[at])
            if not slot:
                raise bad("a slot is '--   name  what it holds' or '--   ...name  ...'")
            local = slot.group(2) + ("_at" if slot.group(1) else "")
            if tail:
                raise bad(f"{slot.group(2)!r} after the tail {tail!r}: a tail comes last")
            if keyword.iskeyword(local) or local in LUA_KEYWORDS or local in seen:
                raise bad(f"{slot.group(2)!r} names a slot twice, or is a keyword")
            seen.add(local)
            if slot.group(1):
                tail = slot.group(2)
            else:
                names.append(slot.group(2))
            at += 1
        found[table] = (names, tail)
    if not any(line.startswith("-- Returns:") for line in lines[at:end]):
        raise bad("no '-- Returns:' line after ARGV")
    return Declared(name, " ".join(a for a in about if a), flags, roles,
                    tuple(found["KEYS"][0]), tuple(found["ARGV"][0]),
                    found["KEYS"][1], found["ARGV"][1])


def _scripts() -> dict[str, Declared]:
    folder = resources.files("pending_actions.broker.atomic") / "lua"
    # prelude.lua is no script: the definitions the scripts share (source.py)
    names = sorted(p.name[:-4] for p in folder.iterdir()
                   if p.name.endswith(".lua") and p.name != "prelude.lua")
    return {n: parse(f"broker/atomic/lua/{n}.lua", lua_file(n)) for n in names}


SCRIPTS = _scripts()
NAMES = tuple(SCRIPTS)


class Slots:
    """One NamedTuple class per script, by its name: ``KEYS.take(directive=..., ...)``. Built
    by keyword, so no caller gets a slot's order wrong; a tuple, so Redis is sent it as it is
    (no copy into a list). On the hot path build one as ``X.__new__(X, ...)``: ``X(...)`` by
    keyword first packs the keywords into a dict, which takes twice as long."""

    def __init__(self, table: str) -> None:
        for d in SCRIPTS.values():
            fields = d.keys if table == "KEYS" else d.argv
            camel = "".join(part.title() for part in d.name.split("_"))
            setattr(self, d.name, namedtuple(f"{camel}{table.title()}", fields))

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...


KEYS = Slots("KEYS")
ARGV = Slots("ARGV")


def scripts_of(role: str) -> tuple[str, ...]:
    """The scripts whose header names ``role``: what its Redis user may run."""
    return tuple(n for n, d in SCRIPTS.items() if role in d.roles)
