"""The one wait of the tests (tests/support/waits.py): it returns the answer, fails naming what
it awaited at its deadline, and fails at once with a watched child's output when it exits."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from tests.support.waits import Watched, wait_until


def test_the_answer_is_returned() -> None:
    asked: Iterator[object] = iter([None, False, 0, [], "yes"])
    assert wait_until(lambda: next(asked), 5, "a yes", interval_s=0) == "yes"


def test_the_deadline_names_what_was_awaited() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"the moon: not within 0.2 s"):
        wait_until(lambda: None, 0.2, "the moon")
    assert time.monotonic() - started < 5


def test_a_watched_child_that_exits_fails_the_wait_at_once_with_its_output() -> None:
    child = Watched.start("quitter", [sys.executable, "-c",
                                      "import sys; print('said'); sys.exit('why: it broke')"])
    try:
        started = time.monotonic()
        with pytest.raises(AssertionError) as failed:
            wait_until(lambda: None, 60, "a ready that never comes", watching=[child])
        assert time.monotonic() - started < 30  # not the deadline
    finally:
        child.close()
    said = str(failed.value)
    assert "a ready that never comes" in said and "quitter" in said
    assert "exited with 1" in said and "said" in said and "why: it broke" in said
