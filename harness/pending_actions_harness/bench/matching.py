"""Globs against long payload strings, the worst a model could write: each pattern's
per-decision time through ``Policy(...).decide`` (the path a stage takes) on a string of
``--size`` characters, the median and range of ``--repeat`` decisions; beside it the regex
this project matched globs with before (``broker/policy/globs.py`` until the matcher of
``broker/policy/lanes.py``), timed alone (its ``fullmatch``) at the largest size that still finishes
quickly: it backtracks, so each doubling of the size can cost it 8x, and a size is only tried
while the one before took under ``--regex-budget`` / 8 seconds.

``python -m pending_actions_harness.bench.matching [--size 65536] [--repeat 15]``"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

from pending_actions.broker.policy.rules import Policy

# (name, glob, the string of n characters it is decided against): each made to cost the most
# for its kind of glob. None matches: a match found early ends the search early. Where a run
# of the glob has a literal stretch the string holds it again and again, each time where the
# rest of the run fails, so that str.find's few places all miss and the masks are made.
PATTERNS: list[tuple[str, str, Callable[[int], str]]] = [
    ("sudo rm -rf", "*sudo *rm *-rf*", lambda n: ("sudo rm " * n)[:n]),
    ("many stars", "*a*a*a*a*a*a*a*a*b*", lambda n: "a" * n),
    ("sets", "*[sS][uU][dD][oO] *[rR][mM] *-[rR][fF]*", lambda n: ("SUDO rM -x " * n)[:n]),
    ("40 of ? and a", "*" + "?a" * 20 + "b*", lambda n: ("a" * 30 + "b") * (n // 31)),
    ("30 ranges", "*" + "[a-z]" * 30 + "0*", lambda n: ("a" * 20 + "0") * (n // 21)),
    ("long literal", "*" + "ab" * 500 + "c*", lambda n: ("ab" * n)[:n]),
    ("ASCII glob, emoji text", "*[sS]udo?rm*-rf*", lambda n: ("xudo\U0001f600rm " * n)[:n]),
    ("Cyrillic glob and text", "*[пП]ароль[=:]?[!ж-я]*", lambda n: ("Жароль=1 " * n)[:n]),
    ("? in glob and text", "*[?&]token=*", lambda n: ("xtoken=ж? " * n)[:n]),
    ("emoji glob and text", "*\U0001f600[!\U0001f600]\U0001f600*",
     lambda n: "\U0001f600" * n),
]
REGEX_START = 1024  # the old regex's first size; doubled from there up to --size


def old_regex(glob: str) -> re.Pattern[str]:
    """The regex the previous matcher built from a glob (its ``translate``): ``*`` ``.*``,
    ``?`` ``.``, a set a class, everything else escaped; kept here to be measured against."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "\\":
            out.append(re.escape(glob[i + 1]))
            i += 2
        elif c == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            end = glob.index("]", i + 2)  # the globs above have no ] or \ inside a set
            body = glob[i + 1:end]
            negate = body.startswith("!")
            out.append(f"[{'^' if negate else ''}{body[1:] if negate else body}]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def timed(call: Callable[[str], Any], text: str, repeat: int) -> tuple[list[float], Any]:
    """The time in ms of each of ``repeat`` calls of ``call(text)``, and what it answered."""
    took = []
    answer = None
    for _ in range(repeat):
        started = time.perf_counter()
        answer = call(text)
        took.append((time.perf_counter() - started) * 1000)
    return took, answer


def spread(took: list[float]) -> str:
    return f"{statistics.median(took):9.3f} ms ({min(took):.3f}-{max(took):.3f})"


Timed = tuple[list[float], bool]  # the times in ms, and whether it matched


def regex_run(glob: str, text: str, budget: float) -> Timed | None:
    """The old regex on ``text``, 3 times, in a child process (a backtracking regex cannot be
    stopped in its own): None when the 3 take past ``budget`` seconds."""
    here, there = multiprocessing.Pipe(duplex=False)

    def child() -> None:
        took, found = timed(old_regex(glob).fullmatch, text, 3)
        there.send((took, found is not None))

    process = multiprocessing.get_context("fork").Process(target=child, daemon=True)
    process.start()
    answer = here.recv() if here.poll(budget) else None
    if answer is None:
        process.kill()
    process.join()
    return cast(Timed | None, answer)


def regex_sizes(glob: str, make: Callable[[int], str], most: int,
                budget: float) -> tuple[int, Timed | None]:
    """The largest size, doubling from ``REGEX_START`` up to ``most``, at which the old regex
    ran 3 times within ``budget`` seconds, and how; a size is not tried once the one before
    took an eighth of the budget (a doubling costs a backtracking regex 8x, or far more).
    None: not even the first size was done in time."""
    size, done = REGEX_START, None
    for tried in (REGEX_START << k for k in range(most.bit_length())):
        if tried > most:
            break
        answer = regex_run(glob, make(tried), budget)
        if answer is None:
            break
        size, done = tried, answer
        if sum(answer[0]) / 1000 > budget / 8:
            break
    return size, done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=65_536, help="characters in each string")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--regex-budget", type=float, default=3.0,
                        help="seconds the old regex may take at its largest size, 3 times")
    args = parser.parse_args()
    print(f"per decision: the median (range) of {args.repeat} decisions of a {args.size}-"
          "character string; the old regex's fullmatch 3 times at the largest size it finishes")
    worst = 0.0
    for name, glob, make in PATTERNS:
        policy = Policy({"rules": [{"name": "r", "match": {"payload": {"cmd": glob}},
                                    "decision": "deny"}]})

        def denied(text: str, policy: Policy = policy) -> bool:
            return policy.decide(tool="t", apply="h", label="l", session="s",
                                 payload={"cmd": text}).decision == "deny"

        text = make(args.size)
        took, matched = timed(denied, text, args.repeat)
        worst = max(worst, statistics.median(took))
        size, done = regex_sizes(glob, make, args.size, args.regex_budget)
        if done is None:
            old = f"old regex: 3 runs not done in {args.regex_budget} s at {size // 1024} K"
        else:
            old = f"old regex at {size // 1024:2} K: {spread(done[0])}" + (
                "" if done[1] == denied(make(size)) else "  (answered otherwise!)")
        print(f"{name:23} {'match' if matched else 'no match':8} {spread(took)}   {old}")
    print(f"worst median per decision: {worst:.3f} ms")


if __name__ == "__main__":
    main()
