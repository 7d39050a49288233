"""Where a run of glob atoms of fixed length first occurs in a text, with every character of the
text tested in C, never in a Python loop per character: the text becomes one lane per
character of a big int, each atom a mask of the lanes it accepts, and the run the AND of its
atoms' masks, each shifted back by the atom's place in the run. The work is a few passes over
the text per atom (``broker/policy/globs.py`` splits a glob at its stars into these runs). Before
any mask, a run with a literal character tries a few places where str.find sees its longest
literal stretch: most texts answer there, or have no such stretch at all.

A byte per character wherever one can say all the run needs: ``bytes.translate`` then tests a
byte against up to 8 atoms at once, a bit each. That byte is the character itself in a
Latin-1 text. In any other text, characters the run never names are all alike to it, so each
is written as ``?`` (``encode(..., 'replace')``): as Latin-1 when the run names nothing above
U+00FF, else through a charmap of the (at most 254) characters it names; when the run names
``?`` and the text holds some, those are found apart (three byte planes of its UTF-32) and
written into the masks. Otherwise (a range of many characters above U+00FF, a character beyond
the BMP) UTF-32, a lane of 32 bits, each atom's test arithmetic on all lanes at once: a code
point is below 2**21, so adding a constant below 2**21 to each lane never carries into the
next, and bit 21 of a lane's sum tells whether the lane was at least the constant's
complement."""

from __future__ import annotations

import codecs
import contextlib
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LATIN = 0x100
OTHER = -1  # a decoder's code for every character the run does not name (all alike to it)
QUESTION = ord("?")
_BY_CHARACTER = 4  # a literal stretch up to this long is compared character by character
_TRIES = 4  # places ``find`` tries by str.find before it makes masks
_NAMED_MAX = 254  # the bytes a charmap has for named characters: 0 is NUL's, 255 is ``?``'s
_FLAG = 21  # the bit of a UTF-32 lane that a comparison leaves its answer in
_TOP = 1 << _FLAG
_LOW_BIT = bytes(b & 1 for b in range(256))  # bytes.translate: a byte's bit 0 alone
_IS_QUESTION = bytes(b == QUESTION for b in range(256))
_IS_ZERO = bytes(b == 0 for b in range(256))
LATIN_CODES = tuple(range(256))
REPLACED_CODES = tuple(OTHER if c == QUESTION else c for c in range(256))


@dataclass(frozen=True)
class CharSet:
    """``[...]`` (``negate``: ``[!...]``): code point ranges, both ends included."""

    negate: bool
    ranges: tuple[tuple[int, int], ...]

    def accepts(self, code: int) -> bool:
        return any(lo <= code <= hi for lo, hi in self.ranges) != self.negate


# one character: itself (a str of one), one of a set, or any (None, which ``?`` is)
Atom = str | CharSet | None
# a translate table for up to 8 atoms, the shift of each atom of the run it holds, and the
# byte it makes of ``?``
_Group = tuple[bytes, tuple[int, ...], int]


def accepts(atom: Atom, code: int) -> bool:
    """Whether ``atom`` takes the character ``code`` (``OTHER``: one it does not name)."""
    if atom is None:
        return True
    if isinstance(atom, str):
        return ord(atom) == code
    return atom.negate if code == OTHER else atom.accepts(code)


class Text:
    """One text's facts a run may ask, each found the first time and shared by the runs of
    one match."""

    __slots__ = ("_latin", "_question", "_tried", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._tried = False
        self._latin: bytes | None = None
        self._question: bool | None = None

    def latin(self) -> bytes | None:
        """The text in Latin-1, or None when a character is above U+00FF."""
        if not self._tried:
            self._tried = True
            with contextlib.suppress(UnicodeEncodeError):  # above U+00FF: stays None
                self._latin = self.text.encode("latin-1")
        return self._latin

    def question(self) -> bool:
        if self._question is None:
            self._question = "?" in self.text
        return self._question


class Run:
    """A run of atoms without a star: ``head``/``tail`` (does it match at the start / the end
    of a text long enough), ``exact`` (is it the whole text), ``at`` (here) and ``find`` (the
    leftmost place it matches)."""

    __slots__ = ("_anchor", "_charmap", "_latin_named", "_names_question", "_sets",
                 "_stretches", "_tables", "atoms", "exact", "head", "literal", "size", "tail")

    def __init__(self, atoms: tuple[Atom, ...]) -> None:
        self.atoms = atoms
        self.size = len(atoms)
        # all literal: str.find / startswith, no masks
        self.literal: str | None = "".join(a for a in atoms if isinstance(a, str)) \
            if all(isinstance(a, str) for a in atoms) else None
        # each stretch of literal characters compared as one string, each set by itself; ``?``
        # needs no test
        stretches: list[tuple[int, str]] = []
        sets: list[tuple[int, CharSet]] = []
        for i, atom in enumerate(atoms):
            if isinstance(atom, str):
                if stretches and stretches[-1][0] + len(stretches[-1][1]) == i:
                    stretches[-1] = (stretches[-1][0], stretches[-1][1] + atom)
                else:
                    stretches.append((i, atom))
            elif atom is not None:
                sets.append((i, atom))
        self._stretches = tuple(stretches)
        self._sets = tuple(sets)
        # where ``find`` looks first: the longest stretch, found by str.find
        self._anchor = max(stretches, key=lambda s: len(s[1]), default=None)
        self.head = self._anchored(0)
        self.tail = self._anchored(-self.size)
        self.exact = self._anchored(0, exact=True)
        literals = [ord(a) for a in atoms if isinstance(a, str)]
        ranges = [r for a in atoms if isinstance(a, CharSet) for r in a.ranges]
        self._names_question = QUESTION in literals or any(lo <= QUESTION <= hi
                                                           for lo, hi in ranges)
        self._latin_named = all(c < LATIN for c in literals) and all(hi < LATIN
                                                                     for _lo, hi in ranges)
        self._charmap: tuple[Any, tuple[int, ...]] | None = None
        if not self._latin_named and self.literal is None:
            self._charmap = _charmap(literals, ranges)
        self._tables: dict[tuple[int, ...], tuple[_Group, ...]] = {}

    def _anchored(self, base: int, exact: bool = False) -> Callable[[str], bool]:
        """The test at one end of a text (``base`` 0: the start, ``-size``: the end; ``exact``:
        and the text is exactly as long as the run), in one Python call: the stretches cut by one
        C call (itemgetter) and compared at once, so that a glob without a star (``ed?t``)
        costs about what a regex's match did."""
        # a short stretch by its characters (str indexing hands out shared one-character
        # strings, no copy), a long one as a slice
        cuts: list[int | slice] = []
        wanted: list[str] = []
        for offset, chars in self._stretches:
            if len(chars) <= _BY_CHARACTER:
                cuts += range(base + offset, base + offset + len(chars))
                wanted += chars
            else:
                cuts.append(slice(base + offset, base + offset + len(chars) or None))
                wanted.append(chars)
        sets = tuple((base + offset, charset) for offset, charset in self._sets)
        take: Callable[[str], object]
        want: object
        if len(cuts) > 1:
            take, want = operator.itemgetter(*cuts), tuple(wanted)
        elif cuts:
            take, want = operator.itemgetter(cuts[0]), wanted[0]
        else:
            take, want = (lambda value: None), None
        size = self.size
        if exact and sets:
            return lambda value: len(value) == size and take(value) == want and all(
                charset.accepts(ord(value[i])) for i, charset in sets)
        if exact:
            return lambda value: len(value) == size and take(value) == want
        if sets:
            return lambda value: take(value) == want and all(
                charset.accepts(ord(value[i])) for i, charset in sets)
        return lambda value: take(value) == want

    def at(self, text: str, start: int) -> bool:
        """Whether the run matches ``text`` at ``start`` (which leaves room for it): work in
        the run's size, not the text's."""
        for offset, chars in self._stretches:
            if not text.startswith(chars, start + offset):
                return False
        return all(charset.accepts(ord(text[start + offset])) for offset, charset in self._sets)

    def find(self, text: Text, start: int, end: int) -> int:
        """The leftmost place in ``text[start:end]`` the run matches whole, or -1."""
        if end - start < self.size:
            return -1
        if self.literal is not None:
            return text.text.find(self.literal, start, end)
        if self._anchor is not None:
            # a few places where the longest stretch is, tried one by one: most texts answer
            # here (or have no such stretch at all), long before a mask could be made
            offset, chars = self._anchor
            last = end - self.size + offset + len(chars)  # the stretch ends by here
            for _try in range(_TRIES):
                hit = text.text.find(chars, start + offset, last)
                if hit < 0:
                    return -1
                if self.at(text.text, hit - offset):
                    return hit - offset
                start = hit - offset + 1
        elif not self._sets:  # only ``?``: anywhere there is room
            return start
        if end - start < self.size:
            return -1
        found = -1
        latin = text.latin()
        if latin is not None:
            found = self._find_bytes(latin[start:end], LATIN_CODES)
        elif self._latin_named or self._charmap is not None:
            part = text.text[start:end]
            if self._charmap is None:
                data, codes = part.encode("latin-1", "replace"), REPLACED_CODES
            else:
                data, codes = codecs.charmap_encode(part, "replace", self._charmap[0])[0], \
                    self._charmap[1]
            # the text's own ``?``s, written as the others are: found apart, if they matter
            questions = _questions(part) if self._names_question and text.question() else 0
            found = self._find_bytes(data, codes, questions)
        else:
            found = self._find_wide(text.text[start:end])
        return -1 if found < 0 or found > end - start - self.size else start + found

    # Each finder may answer a place too late for the run to fit (a ``?`` at its end tests
    # nothing past the text); ``find`` refuses those, and since the leftmost answer is too late
    # only when every answer is, nothing is lost.
    def _find_bytes(self, data: bytes, codes: tuple[int, ...], questions: int = 0) -> int:
        """``data``: a byte a character, byte ``b`` standing for the character ``codes[b]``;
        ``questions``: 1 in the byte of each ``?`` of the text the bytes do not tell."""
        together = -1  # all ones: the AND of nothing yet
        spread = questions * 0xFF  # each of those bytes all ones
        for table, shifts, question in self._tables_for(codes):
            lanes = int.from_bytes(data.translate(table), "little")
            if questions:  # (lanes & ~spread would make a negative int: see _find_wide)
                lanes = lanes ^ (lanes & spread) | questions * question
            for shift in shifts:
                together &= lanes >> shift
        # bit 0 of each byte is the answer at that place; the other bits are other atoms' tests
        return together.to_bytes(len(data), "little").translate(_LOW_BIT).find(1)

    def _tables_for(self, codes: tuple[int, ...]) -> tuple[_Group, ...]:
        """Up to 8 distinct atoms a table, each a bit of every byte ``translate`` writes; for
        the atom at ``i`` in the run, the shift that brings its bit for place ``p + i`` down to
        bit 0 of place ``p``; and the byte a ``?`` is written as."""
        made = self._tables.get(codes)
        if made is None:
            distinct = list(dict.fromkeys(a for a in self.atoms if a is not None))
            groups = []
            for first in range(0, len(distinct), 8):
                members = distinct[first:first + 8]
                shifts = tuple(8 * i + members.index(atom)
                               for i, atom in enumerate(self.atoms) if atom in members)
                groups.append((bytes(_bits(members, code) for code in codes), shifts,
                               _bits(members, QUESTION)))
            made = self._tables[codes] = tuple(groups)
        return made

    def _find_wide(self, text: str) -> int:
        lanes = int.from_bytes(text.encode("utf-32-le", "surrogatepass"), "little")
        ones = _ones(len(text))
        below, flags = ones * (_TOP - 1), ones << _FLAG
        # bit 21 of a lane of ``missed``: some atom refused the character its place put it on.
        # Every int here stays positive: a negative one costs CPython a two's complement copy
        # in each bitwise operation.
        missed = 0
        refused: dict[Atom, int] = {}
        for i, atom in enumerate(self.atoms):
            if atom is None:
                continue
            if atom not in refused:
                refused[atom] = _refusals(atom, lanes, ones, below, flags)
            missed |= refused[atom] >> (32 * i)
        hits = (missed & flags) ^ flags
        # bit 21 of a lane down to its bit 0: the lane's first byte is 1, all else 0
        found = (hits >> _FLAG).to_bytes(4 * len(text), "little").find(1)
        return found if found < 0 else found // 4


def _charmap(literals: list[int], ranges: list[tuple[int, int]]) \
        -> tuple[Any, tuple[int, ...]] | None:
    """The charmap that writes each character the run names as a byte of its own, NUL as 0 and
    every other character as ``?`` (255), and the code each byte stands for; None when the
    run names too many, or one a charmap cannot hold (beyond the BMP; U+FFFE, its mark of a
    byte unused)."""
    named = set(literals)
    for lo, hi in ranges:
        named.update(range(lo, min(hi, lo + _NAMED_MAX + 2) + 1))
        if len(named) > _NAMED_MAX + 2:  # NUL and ``?`` may be among them
            return None
    named -= {0, QUESTION}  # NUL has byte 0 anyway; the text's ``?``s are found apart
    if len(named) > _NAMED_MAX or any(c >= 0xFFFE for c in named):
        return None
    order = sorted(named)
    decoding = "\x00" + "".join(map(chr, order)) + "\ufffe" * (_NAMED_MAX - len(order)) + "?"
    codes = (0, *order, *[OTHER] * (255 - len(order)))
    mapping = codecs.charmap_build(decoding)
    if isinstance(mapping, dict):  # a Python lookup a character: named across too many blocks
        return None
    return mapping, codes


def _bits(members: list[CharSet | str], code: int) -> int:
    """The byte for a character: bit k set when ``members[k]`` takes it."""
    return sum(1 << bit for bit, atom in enumerate(members) if accepts(atom, code))


def _questions(text: str) -> int:
    """1 in the byte of each ``?`` of ``text``, 0 in every other: a character's code point is
    the three low bytes of its UTF-32, each read in one C pass (a slice of every 4th byte)."""
    wide = text.encode("utf-32-le", "surrogatepass")
    low, middle, high = (int.from_bytes(wide[k::4].translate(table), "little")
                         for k, table in ((0, _IS_QUESTION), (1, _IS_ZERO), (2, _IS_ZERO)))
    return low & middle & high


def _ones(lanes: int) -> int:
    """1 in each of ``lanes`` 32-bit lanes, doubled up: each step copies all there is."""
    out, width = 1, 1
    while width < lanes:
        out |= out << (32 * width)
        width *= 2
    return out & ((1 << (32 * lanes)) - 1)


def _refusals(atom: CharSet | str, lanes: int, ones: int, below: int, flags: int) -> int:
    """Bit 21 of each lane set where ``atom`` refuses the lane's character (other bits:
    anything). ``below``: 2**21 - 1 in every lane; ``flags``: bit 21 of every lane."""
    if isinstance(atom, str):
        return _outside(ord(atom), ord(atom), lanes, ones, below, flags)
    outside = -1  # outside every range: the AND of each range's
    for lo, hi in atom.ranges:
        outside &= _outside(lo, hi, lanes, ones, below, flags)
    return (outside & flags) ^ flags if atom.negate else outside


def _outside(lo: int, hi: int, lanes: int, ones: int, below: int, flags: int) -> int:
    """Bit 21 of each lane set where its character is not in lo..hi (other bits: anything)."""
    if lo == hi:
        # a lane XOR the character is 0 exactly where they are equal; any other value plus
        # 2**21 - 1 reaches bit 21
        return (lanes ^ ones * lo) + below
    # bit 21: at least lo, and (XOR) more than hi (which implies at least lo); then not
    return (lanes + ones * (_TOP - lo)) ^ (lanes + below - ones * hi) ^ flags
