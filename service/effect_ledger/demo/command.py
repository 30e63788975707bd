"""`effect-ledger demo` (the CLI imports this module only for `demo`; the work is imported lazily)."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from typing import TYPE_CHECKING

from effect_ledger.settings import Settings

if TYPE_CHECKING:
    from effect_ledger.demo.scenario import Timeline

INTRO = """effect-ledger demo: chapter 15's lost measurement receipt, end to end
  two measurements through a fake measurement service; B's answer is lost after submission.
  an orchestrator journals the comparison and reopens it without running the past (section 12).
  a charge waits for a second principal's yes; a run cancelled while waiting never executes (section 15).
"""


def demo_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run the reference scenario against a fresh database and an in-process service; 0 only if all held."""
    return run_demo(settings)


def run_demo(settings: Settings) -> int:
    """Stage the database and the service, run the scenario, print its timeline and verdict."""
    from effect_ledger.demo.approval_step import APPROVER
    from effect_ledger.demo.journal_trace import ORCHESTRATOR
    from effect_ledger.demo.scenario import AUDITOR, EXECUTOR, RECONCILER, TENANT, Timeline
    from effect_ledger.demo.stage import demo_database
    from effect_ledger.http.auth import mint_token

    secret = secrets.token_urlsafe(48)  # this run's own signing key; nothing outside the demo knows it
    scopes = {
        EXECUTOR: "ledger:execute",
        RECONCILER: "ledger:reconcile",
        AUDITOR: "ledger:audit",
        ORCHESTRATOR: "journal:write journal:read",
        APPROVER: "ledger:approve",
    }
    tokens = {sub: mint_token(secret, TENANT, sub, scope, Settings()) for sub, scope in scopes.items()}
    print(INTRO, flush=True)
    timeline = Timeline()
    try:
        with demo_database(settings) as database:
            print(f"database: {database.where}", flush=True)
            asyncio.run(_run(database.url, secret, tokens, timeline))
    except Exception as exc:  # the demo's answer is its exit status: say what stopped it
        print(f"\ndemo stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        timeline.expect(f"the scenario ran to the end (stopped by {type(exc).__name__})", False)
    return 0 if timeline.verdict() else 1


async def _run(database_url: str, secret: str, tokens: dict[str, str], timeline: Timeline) -> None:
    from effect_ledger.demo.scenario import run_scenario
    from effect_ledger.demo.stage import running_service

    async with running_service(database_url, secret) as base_url:
        print(f"service:  {base_url} (in-process), tenant northstar\n", flush=True)
        await run_scenario(base_url, tokens, timeline)
