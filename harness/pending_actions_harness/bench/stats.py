"""Numbers: latency samples and their summary, and one row of the final table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on unsorted input."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Dist:
    """Latency samples of one measurement, in milliseconds."""

    name: str
    samples_ms: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0  # for throughput: the wall time the samples took together

    def add_seconds(self, seconds: float) -> None:
        self.samples_ms.append(seconds * 1000)

    @property
    def p50(self) -> float:
        return percentile(self.samples_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 99)

    @property
    def throughput(self) -> float:
        return len(self.samples_ms) / self.wall_s if self.wall_s else math.nan

    def summary(self) -> dict[str, Any]:
        s = self.samples_ms
        out: dict[str, Any] = {
            "n": len(s), "errors": self.errors,
            "p50_ms": self.p50, "p90_ms": percentile(s, 90), "p99_ms": self.p99,
            "min_ms": min(s) if s else math.nan, "max_ms": max(s) if s else math.nan,
            "mean_ms": sum(s) / len(s) if s else math.nan,
        }
        if self.wall_s:
            out["wall_s"] = self.wall_s
            out["throughput_per_s"] = self.throughput
        return out


@dataclass
class Row:
    """One figure of ours beside the baseline measured in the same run.

    ``ratio`` is always value / baseline; ``better`` says which direction is good for it."""

    key: str
    figure: str
    value: float | None
    unit: str
    baseline: str
    baseline_value: float | None
    better: str = "lower"  # "lower" (latency, memory, commands) or "higher" (throughput)
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline_value or math.isnan(self.baseline_value):
            return None
        return self.value / self.baseline_value

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "figure": self.figure, "value": _finite(self.value),
                "unit": self.unit, "baseline": self.baseline,
                "baseline_value": _finite(self.baseline_value), "ratio": _finite(self.ratio),
                "better": self.better, "target": self.target, "met": self.met,
                "note": self.note}


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


def fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if unit == "ms":
        return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms"
    if unit == "B":
        return f"{value:,.0f} B"
    if unit == "us":
        return f"{value:,.0f} us"
    if unit in ("cmd", "reads"):
        return f"{value:.2f} {unit}"
    if unit in ("/s", "cmd/s"):
        return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{value:g} {unit}"


def fmt_ratio(row: Row) -> str:
    r = row.ratio
    if r is None:
        return "-"
    if row.unit == "ms" and r > 0 and r < 1:
        return f"{r:.3f}x ({1 / r:.0f}x faster)" if r < 0.1 else f"{r:.2f}x"
    return f"{r:.2f}x"
