"""`effect-ledger bench`: its flags and its handler (the CLI imports this module only for `bench`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from typing import Any

from effect_ledger.settings import Settings

INSTALL = "pip install effect-ledger-bench (./bench in the repository)"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated integers, e.g. 0,1000000,5000000") from None
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError("growth sizes must be non-negative")
    return sizes


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    """The bench's own flags; each defaults to the full run's value (or the smoke run's with --smoke)."""
    parser.add_argument("--duration", type=float, help="seconds measured per layer (default 10)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up before each measurement (default 3)")
    parser.add_argument("--concurrency", type=int, help="concurrent executors / pgbench clients (default 16)")
    parser.add_argument(
        "--growth-sizes",
        type=_sizes,
        help="measure growth: operations preloaded per row, e.g. 0,1000000,5000000 (default: not measured)",
    )
    parser.add_argument("--growth-duration", type=float, help="seconds measured per growth row (default 10)")
    parser.add_argument("--replay-duration", type=float, help="seconds of replayed claims (default 6)")
    parser.add_argument(
        "--neighbour-duration", type=float, help="seconds of the quiet tenant alone, then beside a flood (10)"
    )
    parser.add_argument("--contention-executors", type=int, help="executors racing for hot IDs (default 64)")
    parser.add_argument("--hot-ids", type=int, help="IDs raced for (default 100)")
    parser.add_argument("--journal", action="store_true", default=None, help="measure the run journal too")
    parser.add_argument("--workers", type=int, help="serve worker processes (default 1, as serve)")
    parser.add_argument(
        "--generator",
        choices=("auto", "wrk", "python"),
        help="HTTP load generator: wrk when installed (auto), or Python processes",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: proves it runs")


def bench_command(args: argparse.Namespace, settings: Settings) -> int:
    """Measure effect cycles against the PostgreSQL limit, and print the table."""
    try:
        from effect_ledger_bench.runner import BenchConfig, run_bench
    except ModuleNotFoundError as missing:
        print(f"effect-ledger bench needs {missing.name}: {INSTALL}", file=sys.stderr)
        return 2

    config = BenchConfig.smoke() if args.smoke else BenchConfig()
    names = (
        "duration",
        "warmup",
        "concurrency",
        "growth_sizes",
        "growth_duration",
        "replay_duration",
        "neighbour_duration",
        "journal",
        "contention_executors",
        "hot_ids",
        "workers",
        "generator",
    )
    flags: dict[str, Any] = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    config = replace(config, database_url=settings.database_url, **flags)
    print(asyncio.run(run_bench(config)), flush=True)
    return 0


def main() -> int:
    """`effect-ledger-bench …`: the same as `effect-ledger bench …`."""
    from effect_ledger.cli import main as cli

    return cli(["bench", *sys.argv[1:]])
