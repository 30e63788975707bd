"""Latency percentiles and the result of one measured load."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CALLS = ("claim", "submit", "complete")


@dataclass(frozen=True)
class Latency:
    """Nearest-rank percentiles of one call's latencies, in milliseconds."""

    count: int
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Latency:
        """Percentiles of the samples (all NaN when there are none)."""
        ordered = sorted(samples)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(ordered), _rank(ordered, 0.50), _rank(ordered, 0.95), _rank(ordered, 0.99))


def _rank(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class LoadResult:
    """What a load generator measured inside its window (warm-up excluded)."""

    window: float  # seconds measured
    cycles: int = 0  # complete claim -> submit -> complete cycles (cycle mode)
    requests: int = 0  # HTTP answers inside the window
    calls: dict[str, list[float]] = field(default_factory=dict)  # call -> latencies in ms
    errors: dict[str, int] = field(default_factory=dict)  # "call status" -> count of unexpected answers
    generator_cpu: float = 0.0  # CPU seconds the generator spent inside the window
    generator: str = "python"
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # contention: id -> status -> count

    def latency(self, call: str) -> Latency:
        """Percentiles of one call."""
        return Latency.of(self.calls.get(call, []))

    @property
    def cycle_rate(self) -> float:
        """Cycles per second."""
        return self.cycles / self.window if self.window > 0 else 0.0

    @property
    def request_rate(self) -> float:
        """Answers per second."""
        return self.requests / self.window if self.window > 0 else 0.0

    def merge(self, other: LoadResult) -> None:
        """Add another process's share of the same window."""
        self.window = max(self.window, other.window)
        self.cycles += other.cycles
        self.requests += other.requests
        self.generator_cpu += other.generator_cpu
        for call, samples in other.calls.items():
            self.calls.setdefault(call, []).extend(samples)
        for key, count in other.errors.items():
            self.errors[key] = self.errors.get(key, 0) + count
        for op_id, statuses in other.outcomes.items():
            mine = self.outcomes.setdefault(op_id, {})
            for status, count in statuses.items():
                mine[status] = mine.get(status, 0) + count


# Student's t, two-sided 95 % (0.975 quantile), by degrees of freedom; above 30, 2.0 (the normal's
# 1.96 rounded up: a little wide rather than narrow).
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float, float]:
    """The geometric mean of positive ratios and its 95 % interval (Student's t on their logarithms):
    what a sitting's pairs of rounds say about the ratio, and how sure that is. At least two."""
    if len(ratios) < 2 or min(ratios) <= 0:
        raise ValueError("an interval needs at least two positive ratios")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    df = len(logs) - 1
    half = (T_975[df - 1] if df <= len(T_975) else 2.0) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
