"""Scenario 3: the service's database connections are terminated at random every 50-500 ms."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from support.harness import Sink, chaos_settings, read_state, scale, scenario, timeout
from support.recording import History
from support.server import Service
from support.workload import executor_clients, reconcile, run_beside_fault

pytestmark = [pytest.mark.chaos, timeout(120, 1200)]

OPERATIONS = scale(150, 1500)  # at least; executors keep taking new ones until enough terminations
TERMINATIONS = scale(40, 500)
EXECUTORS = 8
LEASE_SECONDS = 10

SERVICE_CONNECTIONS = """
SELECT pid FROM pg_stat_activity
WHERE application_name = 'effect-ledger' AND datname = current_database() AND pid <> pg_backend_pid()
"""


async def _terminate_connections(db_url: str, rng: random.Random, done: asyncio.Event) -> int:
    """Every 50-500 ms, terminate one (sometimes every) connection of the service."""
    terminated = 0
    owner = await asyncpg.connect(db_url)
    try:
        while not done.is_set() and terminated < TERMINATIONS:
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            pids = [r["pid"] for r in await owner.fetch(SERVICE_CONNECTIONS)]
            if not pids:
                continue
            victims = pids if rng.random() < 0.1 else [rng.choice(pids)]
            for pid in victims:
                if await owner.fetchval("SELECT pg_terminate_backend($1)", pid):
                    terminated += 1
    finally:
        await owner.close()
    return terminated


async def test_terminated_connections_leave_no_partial_writes(
    request: pytest.FixtureRequest, db_url: str
) -> None:
    history = History()
    with scenario(request, "connection_terminate") as figures:
        async with (
            Sink() as sink,
            Service(chaos_settings(db_url, pool_size=6)) as service,
            executor_clients(service.base_url, history, EXECUTORS) as clients,
        ):
            ids = [f"term-{n}" for n in range(OPERATIONS)]
            tally, terminated = await run_beside_fault(
                clients,
                sink,
                ids,
                LEASE_SECONDS,
                scale(100, 1100),
                lambda done: _terminate_connections(db_url, random.Random(3), done),
            )
            # anything an executor could not finish is the reconciler's, once its lease has run out
            if await _any_open(db_url):
                await asyncio.sleep(LEASE_SECONDS + 0.5)
            reconciled = await reconcile(service.base_url, history, sink)
            state = await read_state(db_url)
        statuses = history.statuses()
        figures.faults = terminated
        figures.extra = {
            "effects": len(ids),
            "answers_503": statuses[503],
            "answers_5xx_other": sum(n for s, n in statuses.items() if s >= 500 and s != 503),
        }
        figures.executed(history, sink, tally.outcomes, reconciled)
        figures.check_run(history, state, sink)
    figures.assert_clean()
    assert terminated > 0 and statuses[503] > 0, "the fault was not injected"
    # retrying through the client completes the work: every effect ran once and is committed
    assert tally.outcomes["committed"] == len(ids) == sink.total >= OPERATIONS


async def _any_open(db_url: str) -> bool:
    owner = await asyncpg.connect(db_url)
    try:
        return bool(
            await owner.fetchval(
                "SELECT count(*) FROM ledger.operations WHERE status IN ('pending', 'submitted')"
            )
        )
    finally:
        await owner.close()
