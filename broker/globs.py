"""The matching under a policy's rules (``broker/rules.py``): globs and dotted paths into a
payload, as docs/policies.md states them.

Globs (``Glob``): the whole string, case-sensitive, no path meaning (``/`` and ``.`` are
ordinary characters): ``*`` any run, ``?`` one character, ``[...]``/``[!...]`` a set (``]``
first is itself, ``-`` first or last is itself), ``\\`` the next character literally; a ``[``
never closed, a reversed range or a trailing ``\\`` is refused (``BadGlob``). Paths: keys
joined by dots; an all-digit part (no sign, no leading zero) indexes a list; an absent path is
``MISSING``. Values compare as JSON does (``same``: a boolean is no number)."""

from __future__ import annotations

import re
from typing import Any

MISSING = object()  # what ``lookup`` finds at a path that is not there


class BadGlob(ValueError):
    """A pattern that is no glob of ours: what is wrong, in a few words."""


def translate(pattern: str) -> str | None:
    """The regular expression (for ``fullmatch``) a glob stands for; None when it has no special
    character at all (a literal, compared as is). Raises BadGlob."""
    out: list[str] = []
    special = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise BadGlob("it ends with a lone \\")
            out.append(re.escape(pattern[i + 1]))
            special = True
            i += 2
        elif c == "*":
            if not out or out[-1] != ".*":  # a run of stars is one star
                out.append(".*")
            special = True
            i += 1
        elif c == "?":
            out.append(".")
            special = True
            i += 1
        elif c == "[":
            text, i = _char_set(pattern, i)
            out.append(text)
            special = True
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out) if special else None


def _char_set(pattern: str, start: int) -> tuple[str, int]:
    """The set opening at ``pattern[start]`` (a ``[``) as a regex class, and where it ends."""
    n = len(pattern)
    j = start + 1
    negate = j < n and pattern[j] == "!"
    if negate:
        j += 1
    ranges: list[tuple[str, str]] = []
    first = True
    while True:
        if j >= n:
            raise BadGlob(f"the [ at {start} is never closed")
        c = pattern[j]
        if c == "]" and not first:
            break
        c, j = _set_char(pattern, j)
        if j + 1 < n and pattern[j] == "-" and pattern[j + 1] != "]":
            high, j = _set_char(pattern, j + 1)
            if high < c:
                raise BadGlob(f"the range {c}-{high} runs backwards")
            ranges.append((c, high))
        else:
            ranges.append((c, c))
        first = False
    body = "".join(re.escape(a) if a == b else f"{re.escape(a)}-{re.escape(b)}"
                   for a, b in ranges)
    return f"[{'^' if negate else ''}{body}]", j + 1


def _set_char(pattern: str, j: int) -> tuple[str, int]:
    if pattern[j] == "\\":
        if j + 1 >= len(pattern):
            raise BadGlob("it ends with a lone \\")
        return pattern[j + 1], j + 2
    return pattern[j], j + 1


class Glob:
    """A compiled glob: ``matches(text)``."""

    __slots__ = ("literal", "regex", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        found = translate(text)
        self.literal = found is None
        self.regex = None if found is None else re.compile(found, re.DOTALL)

    def matches(self, value: str) -> bool:
        if self.regex is None:
            return value == self.text
        return self.regex.fullmatch(value) is not None

    @property
    def everything(self) -> bool:
        return self.regex is not None and self.regex.pattern == ".*"


def parse_path(path: str) -> tuple[str, ...]:
    parts = tuple(path.split("."))
    if not path or any(p == "" for p in parts):
        raise ValueError("a path is keys joined by single dots, none empty")
    return parts


def lookup(value: Any, parts: tuple[str, ...]) -> Any:
    """``value`` at the dotted path, or ``MISSING``: into objects by key, into lists by an
    all-digit part (0, 1, ...: no sign, no leading zero)."""
    for part in parts:
        if isinstance(value, dict):
            if part not in value:
                return MISSING
            value = value[part]
        elif isinstance(value, list) and index_of(part) is not None:
            k = index_of(part)
            if k is None or k >= len(value):
                return MISSING
            value = value[k]
        else:
            return MISSING
    return value


def index_of(part: str) -> int | None:
    if part.isascii() and part.isdigit() and (part == "0" or not part.startswith("0")):
        return int(part)
    return None


def same(a: Any, b: Any) -> bool:
    """JSON equality: a boolean equals only a boolean (``True == 1`` in Python, not here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and not isinstance(a, bool):
        return isinstance(b, int | float) and a == b
    return type(a) is type(b) and a == b
