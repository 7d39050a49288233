"""broker/policy/lanes.py against a plain search (hypothesis): a run's leftmost place in a stretch
of a text, as ``find`` picks its encoding and by each encoding that can say it (UTF-32 always,
Latin-1 bytes for a Latin-1 text), so each one is checked on every example, whatever the
text's characters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pending_actions.broker.policy.lanes import LATIN_CODES, Atom, CharSet, Run, Text

CHARS = "ab?\x00ÿé€ж😀"
codes = st.sampled_from(CHARS).map(ord)
charsets = st.builds(CharSet, st.booleans(), st.lists(
    st.tuples(codes, codes).map(lambda p: (min(p), max(p))), min_size=1, max_size=3).map(tuple))
atoms = st.lists(st.one_of(st.sampled_from(CHARS), st.none(), charsets), min_size=1, max_size=12)


def takes(atom: Atom, c: str) -> bool:
    if atom is None:
        return True
    if isinstance(atom, str):
        return atom == c
    return any(lo <= ord(c) <= hi for lo, hi in atom.ranges) != atom.negate


def leftmost(run: list[Atom], text: str, start: int, end: int) -> int:
    for p in range(start, end - len(run) + 1):
        if all(takes(a, text[p + i]) for i, a in enumerate(run)):
            return p
    return -1


@settings(max_examples=1000, deadline=None)
@given(atoms, st.text(CHARS, max_size=40), st.data())
def test_every_encoding_finds_the_leftmost_place(run: list[Atom], text: str,
                                                 data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    want = leftmost(run, text, start, end)
    found = Run(tuple(run))
    assert found.find(Text(text), start, end) == want

    def fits(place: int) -> int:  # what find makes of a finder's answer
        return -1 if place < 0 or place > end - start - len(run) else start + place

    if end - start < len(run) or all(a is None for a in run):
        return  # find answers these without a finder
    assert fits(found._find_wide(text[start:end])) == want
    if all(ord(c) < 0x100 for c in text):
        assert fits(found._find_bytes(text[start:end].encode("latin-1"), LATIN_CODES)) == want
