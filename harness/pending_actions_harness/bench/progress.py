"""A progress bar per phase on stderr: tqdm when installed, plain lines otherwise. The table
goes to stdout, so the bar never mixes into what a script would capture."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Tick = Callable[[int], None]


def _load_tqdm() -> Any:
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        return None


class Progress:
    def __init__(self, phases: int, *, enabled: bool = True) -> None:
        self.phases = phases
        self.done = 0
        self._tqdm = _load_tqdm() if enabled else None
        if enabled and self._tqdm is None:
            self.say("no progress bar: tqdm is not installed (pip install tqdm); "
                     "printing one line per phase instead")

    @staticmethod
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    @contextmanager
    def phase(self, name: str, total: int, unit: str = "op") -> Iterator[Tick]:
        """Yields ``tick(n)``, to be called as work completes."""
        self.done += 1
        label = f"[{self.done}/{self.phases}] {name}"
        start = time.monotonic()
        if self._tqdm is None:
            self.say(f"{label} ...")
            yield lambda _n: None
            self.say(f"{label}: {time.monotonic() - start:.1f}s")
            return
        bar = self._tqdm(total=total, desc=label, unit=unit, leave=False, file=sys.stderr,
                         dynamic_ncols=True, mininterval=0.2)
        try:
            yield bar.update
        finally:
            bar.close()
        self.say(f"{label}: {time.monotonic() - start:.1f}s")
