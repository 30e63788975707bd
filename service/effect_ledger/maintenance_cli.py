"""`effect-ledger sweep` and `effect-ledger purge`: one maintenance run each, for CronJobs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from effect_ledger.settings import Settings


def _run(task: str, settings: Settings) -> int:
    """Run one sweep or purge against the configured (or embedded) database and print its summary."""
    from effect_ledger.db.maintenance import purge, sweep
    from effect_ledger.runtime import database

    # Like serve: an embedded database is migrated first; a configured one must already be.
    with database(settings, run_migrations=not settings.database_url) as ready:
        try:
            result = asyncio.run(sweep(ready) if task == "sweep" else purge(ready))
        except (OSError, ValueError) as exc:
            print(json.dumps({"task": task, "error": type(exc).__name__}), file=sys.stderr)
            return 1
    # A run skipped because another replica holds the lock succeeded: that replica is doing the work.
    print(json.dumps(result.summary()))
    return 0


def sweep_command(args: argparse.Namespace, settings: Settings) -> int:
    """Mark submitted operations whose lease expired as unknown (one run; skip if another is running)."""
    return _run("sweep", settings)


def purge_command(args: argparse.Namespace, settings: Settings) -> int:
    """Delete terminal operations older than the retention period (one run; skip if another is running)."""
    return _run("purge", settings)
