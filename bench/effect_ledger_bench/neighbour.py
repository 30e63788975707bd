"""8. A noisy neighbour: the quiet tenant's claim p99 alone, then beside a tenant flooding claims far
above its rate limit (issue 15). Target: within 2x of alone. Printed, never asserted; the test suite
asserts the exact outcomes (tests/integration/test_noisy_neighbour.py)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from effect_ledger_bench.generator import Generator
from effect_ledger_bench.report import Row, verdict
from effect_ledger_bench.stats import LoadResult

FLOOD_TENANT = "bench-flood"
FLOOD_PRINCIPAL = "bench-flooder"
# The flooding tenant's limit; every other tenant of the bench runs unlimited (its rows measure throughput).
FLOOD_LIMIT = {"per_second": 10, "burst": 20}
FLOOD_TASKS = 64
QUIET_EXECUTORS = 4
NEIGHBOUR_P99_FACTOR = 2.0


def rate_limit_env() -> dict[str, str]:
    """serve's rate limit settings for the bench: none, except the flooding tenant's override."""
    return {
        "EFFECT_LEDGER_RATE_LIMIT_PER_SECOND": "0",
        "EFFECT_LEDGER_RATE_LIMIT_OVERRIDES": json.dumps({FLOOD_TENANT: FLOOD_LIMIT}),
    }


async def neighbour_rows(
    gen: Generator, flood_token: str, warmup: float, duration: float
) -> tuple[list[Row], float]:
    """The quiet tenant's cycles alone, then beside the flood; one row each, and the p99 factor."""
    executors = QUIET_EXECUTORS
    alone = await gen.cycles(executors, warmup, duration, "nq-alone")
    # the flood: its own generator process, no pause in its loop, covering the quiet window and more
    flooding = asyncio.create_task(gen.flood([flood_token], FLOOD_TASKS, warmup + duration + 1.0, "flood"))
    beside = await gen.cycles(executors, warmup, duration, "nq-flood")
    flooded = await flooding
    answers = Counter({int(k): v for k, v in flooded.outcomes.get("flood", {}).items()})
    base, loaded = alone.latency("claim"), beside.latency("claim")
    factor = loaded.p99 / base.p99 if base.p99 > 0 else float("nan")
    flood_note = ", ".join(f"{status or 'transport error'}: {n:,}" for status, n in sorted(answers.items()))
    flood_note += f"; {flooded.request_rate:,.0f} req/s at full speed"
    limit = f"limit {FLOOD_LIMIT['per_second']}/s burst {FLOOD_LIMIT['burst']}"
    return [
        Row(
            "4",
            f"neighbour: quiet tenant alone, {executors} executors, claim",
            f"{alone.cycle_rate:,.0f} cycles/s",
            base,
            notes=_errors(alone),
        ),
        Row(
            "4",
            "neighbour: quiet tenant beside a flood, claim",
            f"{beside.cycle_rate:,.0f} cycles/s",
            loaded,
            target=f"p99 <= {NEIGHBOUR_P99_FACTOR:g} x alone: {verdict(factor <= NEIGHBOUR_P99_FACTOR)} "
            f"({factor:.2f}x)",
            notes=f"{_errors(beside)}; flood ({FLOOD_TASKS} connections, {limit}): {flood_note}",
        ),
    ], factor


def _errors(result: LoadResult) -> str:
    if not result.errors:
        return "0 errors"
    return "errors " + ", ".join(f"{k}: {v}" for k, v in sorted(result.errors.items()))
