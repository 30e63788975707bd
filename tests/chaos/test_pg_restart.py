"""Scenario 4: PostgreSQL is restarted with `pg_ctl restart -m immediate` under load."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from effect_ledger.db.migrate import migrate
from effect_ledger.settings import Settings
from support.harness import LedgerState, Sink, chaos_settings, read_state, scale, scenario, timeout
from support.processes import ScratchPostgres
from support.recording import History
from support.server import Service
from support.workload import executor_clients, ledger_client, reconcile, run_beside_fault

pytestmark = [pytest.mark.chaos, timeout(150, 1200)]

RESTARTS = scale(4, 12)
OPERATIONS = scale(60, 400)  # at least; executors keep taking new ones until the restarts are over
EXECUTORS = 6
LEASE_SECONDS = 10
# A 2xx claim, submit or complete is a promise that this event is in the ledger from then on.
ACKNOWLEDGED = {"claim": ("claimed", "reclaimed"), "submit": ("submitted",), "complete": ("completed",)}


@pytest.fixture
async def scratch_pg() -> AsyncIterator[ScratchPostgres]:
    """A migrated PostgreSQL of this test's own, which it may restart."""
    server = ScratchPostgres()
    url = await asyncio.to_thread(server.start)
    try:
        await asyncio.to_thread(lambda: asyncio.run(migrate(Settings(database_url=url))))
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def _restart_under_load(server: ScratchPostgres, rng: random.Random, done: asyncio.Event) -> int:
    restarts = 0
    while restarts < RESTARTS and not done.is_set():
        await asyncio.sleep(rng.uniform(1.0, 2.5))
        await asyncio.to_thread(server.restart_immediate)
        restarts += 1
    return restarts


def missing_acknowledged(history: History, state: LedgerState, tenant: str = "t1") -> list[str]:
    """Every transition answered with a 2xx is in the ledger afterwards, at the attempt it answered."""
    found = []
    for call in history.calls:
        if call.outcome != "ok" or call.kind not in ACKNOWLEDGED or not isinstance(call.body, dict):
            continue
        view = call.body.get("operation", call.body)
        if call.kind == "claim" and call.body.get("action") == "reuse_receipt":
            continue
        kinds, attempt = ACKNOWLEDGED[call.kind], view["attempt"]
        events = state.events.get((tenant, str(call.operation_id)), [])
        wanted = [e for e in events if e["kind"] in kinds and e["attempt"] == attempt]
        if call.kind == "complete":
            wanted = [e for e in wanted if e["to_status"] == view["status"]]
        if not wanted:
            found.append(
                f"{call.operation_id}: {call.kind} answered {call.status} (attempt {attempt}, "
                f"{view['status']}) but its event is missing"
            )
    return found


async def test_postgres_restarted_under_load_keeps_every_acknowledged_transition(
    request: pytest.FixtureRequest, scratch_pg: ScratchPostgres
) -> None:
    history = History()
    settings = chaos_settings(scratch_pg.url, pool_size=6, pool_acquire_timeout_ms=1000)
    with scenario(request, "postgres_restart") as figures:
        async with Sink() as sink, Service(settings) as service:
            ids = [f"pgr-{n}" for n in range(OPERATIONS)]
            async with executor_clients(service.base_url, history, EXECUTORS) as clients:
                tally, restarts = await run_beside_fault(
                    clients,
                    sink,
                    ids,
                    LEASE_SECONDS,
                    scale(120, 1100),
                    lambda done: _restart_under_load(scratch_pg, random.Random(11), done),
                )
            # the same service process, never restarted, serves normally again
            after = History()
            async with ledger_client(service.base_url, after) as client:
                fresh = await client.claim("pgr-after", tool="chaos-sink", tool_version="1", intent={})
            reconciled = await reconcile(service.base_url, history, sink)
            state = await read_state(scratch_pg.url)
        statuses = history.statuses()
        figures.faults = restarts
        figures.extra = {
            "effects": len(ids),
            "answers_503": statuses[503],
            "acknowledged": sum(1 for c in history.calls if c.outcome == "ok"),
        }
        figures.executed(history, sink, tally.outcomes, reconciled)
        figures.check(missing_acknowledged(history, state))
        figures.check_run(history, state, sink, not_effects=frozenset({("t1", "pgr-after")}))
    figures.assert_clean()
    assert restarts == RESTARTS and statuses[503] > 0
    assert fresh.action == "execute" and after.statuses() == {201: 1}
