"""The printed table: one row per measurement, targets beside the figures, ratios last."""

from __future__ import annotations

import math
from dataclasses import dataclass

from effect_ledger_bench.stats import Latency

# The targets of issues 8 and 11, on a 2-core machine, measured in one run (printed, never asserted).
SERVICE_TO_LIMIT = 0.5  # of the one-statement limit (issue 11)
CLAIM_P99_MS = 10.0
SERVICE_CPU_PER_CYCLE_MS = 1.2
GROWTH_P50_FACTOR = 1.25
RSS_PER_WORKER_MB = 150.0


@dataclass(frozen=True)
class Row:
    """One printed line."""

    step: str  # 1..7, the measurement's number in the issue
    name: str
    rate: str = ""
    latency: Latency | None = None
    notes: str = ""
    target: str = ""


def verdict(ok: bool) -> str:
    """PASS or MISS."""
    return "PASS" if ok else "MISS"


def ms(value: float) -> str:
    """A latency in milliseconds for the table."""
    return "-" if math.isnan(value) else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def mib(size: int) -> str:
    """Bytes as MiB (GiB above 10 GiB)."""
    return f"{size / 2**30:.1f} GiB" if size >= 10 * 2**30 else f"{size / 2**20:.0f} MiB"


def render(title: list[str], rows: list[Row]) -> str:
    """The whole report as text."""
    header = ("#", "measurement", "rate", "p50 ms", "p95 ms", "p99 ms", "target", "notes")
    cells = [header]
    for row in rows:
        lat = row.latency
        cells.append(
            (
                row.step,
                row.name,
                row.rate,
                ms(lat.p50) if lat else "",
                ms(lat.p95) if lat else "",
                ms(lat.p99) if lat else "",
                row.target,
                row.notes,
            )
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(header) - 1)]
    lines = [*title, ""]
    for line in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + line[-1])
    return "\n".join(text.rstrip() for text in lines)
