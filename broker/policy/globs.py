"""The matching under a policy's rules (``broker/policy/rules.py``): globs and dotted paths into a
payload, as docs/policies.md states them.

Globs (``Glob``): the whole string, case-sensitive, no path meaning (``/`` and ``.`` are
ordinary characters): ``*`` any run, ``?`` one character, ``[...]``/``[!...]`` a set (``]``
first is itself, ``-`` first or last is itself), ``\\`` the next character literally; a ``[``
never closed, a reversed range or a trailing ``\\`` is refused (``BadGlob``). No regular
expression, so no backtracking: a glob is parsed into runs of atoms between its stars, each
run found at its leftmost place after the one before (``broker/policy/lanes.py``), and a match takes
time in proportion to the text's length (times the glob's) at worst. Paths: keys joined by
dots; an all-digit part (no sign, no leading zero, at most 9 digits) indexes a list; an absent
path is ``MISSING``. Values compare as JSON does (``same``: a boolean is no number)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pending_actions.broker.policy.lanes import Atom, CharSet, Run, Text

MISSING = object()  # what ``lookup`` finds at a path that is not there


class BadGlob(ValueError):
    """A pattern that is no glob of ours: what is wrong, in a few words."""


def parse(pattern: str) -> tuple[tuple[Atom, ...], ...] | None:
    """The glob's runs of atoms between its stars (a run of stars is one star; n stars, n + 1
    runs, the first and the last maybe empty); None when it has no special character at all
    (a literal, compared as is). Raises BadGlob."""
    runs: list[list[Atom]] = [[]]
    special = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise BadGlob("it ends with a lone \\")
            runs[-1].append(pattern[i + 1])
            special = True
            i += 2
        elif c == "*":
            if runs[-1] or len(runs) == 1:  # a run of stars is one star
                runs.append([])
            special = True
            i += 1
        elif c == "?":
            runs[-1].append(None)
            special = True
            i += 1
        elif c == "[":
            charset, i = _char_set(pattern, i)
            runs[-1].append(charset)
            special = True
        else:
            runs[-1].append(c)
            i += 1
    return tuple(tuple(r) for r in runs) if special else None


def _char_set(pattern: str, start: int) -> tuple[CharSet, int]:
    """The set opening at ``pattern[start]`` (a ``[``), and where it ends."""
    n = len(pattern)
    j = start + 1
    negate = j < n and pattern[j] == "!"
    if negate:
        j += 1
    ranges: list[tuple[int, int]] = []
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
            ranges.append((ord(c), ord(high)))
        else:
            ranges.append((ord(c), ord(c)))
        first = False
    return CharSet(negate, tuple(ranges)), j + 1


def _set_char(pattern: str, j: int) -> tuple[str, int]:
    if pattern[j] == "\\":
        if j + 1 >= len(pattern):
            raise BadGlob("it ends with a lone \\")
        return pattern[j + 1], j + 2
    return pattern[j], j + 1


class Glob:
    """A compiled glob: ``matches(text)``, in time linear in the text (``broker/policy/lanes.py``).
    ``literal``: no special character (``matches`` is ``==``); ``everything``: only stars."""

    __slots__ = ("everything", "literal", "matches", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        found = parse(text)
        self.literal = found is None
        self.everything = found is not None and not any(found)
        self.matches: Callable[[str], bool] = _matcher(text, found)


def _matcher(text: str, found: tuple[tuple[Atom, ...], ...] | None) -> Callable[[str], bool]:
    """The test for one glob, the cheapest its shape allows: ``==``, ``startswith``/
    ``endswith``, ``in``; else a literal start and end checked first, then each run between
    stars at the leftmost place it fits after the one before. Leftmost is always right: a run
    matched earlier leaves the rest more room, and a star takes up whatever lies between."""
    # ``==`` in a lambda, not text.__eq__: that answers NotImplemented (truthy) to a non-str
    if found is None:
        return lambda value: value == text
    runs = tuple(Run(atoms) for atoms in found)
    first, last = runs[0], runs[-1]
    if len(runs) == 1:  # no star: the text is exactly the run
        whole = first.literal
        return first.exact if whole is None else lambda value: value == whole
    middle = runs[1:-1]
    head, tail = first.literal, last.literal
    if not middle and head is not None and tail is not None:
        least = len(head) + len(tail)
        if not tail:
            return lambda value: value.startswith(head)
        if not head:
            return lambda value: value.endswith(tail)
        return lambda value: len(value) >= least and value.startswith(head) \
            and value.endswith(tail)
    if len(middle) == 1 and not first.size and not last.size and middle[0].literal is not None:
        inner = middle[0].literal
        return lambda value: inner in value
    least = sum(r.size for r in runs)

    def matches(value: str) -> bool:
        n = len(value)
        if n < least or not first.head(value) or not last.tail(value):
            return False
        start, end = first.size, n - last.size
        subject = Text(value)
        for run in middle:
            place = run.find(subject, start, end)
            if place < 0:
                return False
            start = place + run.size
        return True

    return matches


def parse_path(path: str) -> tuple[str, ...]:
    parts = tuple(path.split("."))
    if not path or any(p == "" for p in parts):
        raise ValueError("a path is keys joined by single dots, none empty")
    return parts


def lookup(value: Any, parts: tuple[str, ...]) -> Any:
    """``value`` at the dotted path, or ``MISSING``: into objects by key, into lists by an
    index (``index_of``)."""
    for part in parts:
        if isinstance(value, dict):
            if part not in value:
                return MISSING
            value = value[part]
        elif isinstance(value, list):
            k = index_of(part)
            if k is None or k >= len(value):
                return MISSING
            value = value[k]
        else:
            return MISSING
    return value


# No list in a payload is a billion items long; and int() refuses a digit string past 4,300
# digits (Python's guard against quadratic conversion), which a policy's path may well be.
INDEX_DIGITS = 9


def index_of(part: str) -> int | None:
    """The list index a path part names: all digits, no sign, no leading zero, at most
    ``INDEX_DIGITS`` of them; None for any other part (an object's key only)."""
    if len(part) <= INDEX_DIGITS and part.isascii() and part.isdigit() \
            and (part == "0" or not part.startswith("0")):
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
