"""Scenario 2: the service is SIGKILLed at random points of its requests and restarted; executors carry on."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import asyncpg
import pytest

from effect_ledger.domain.timefmt import parse_ts
from support.harness import Sink, read_state, scale, scenario, timeout
from support.processes import ServiceProcess
from support.recording import Call, History
from support.waiting import until
from support.workload import executor_clients, reconcile, run_beside_fault

pytestmark = [pytest.mark.chaos, timeout(150, 1500)]

OPERATIONS = scale(48, 400)  # at least; executors keep taking new ones while the killer is at work
EXECUTORS = 6
KILLS = scale(12, 45)  # a multiple of three: each target kind is cut as often
LEASE_SECONDS = 2
TARGETS = ("claim", "submit", "complete")


async def _kill_mid_request(
    service: ServiceProcess, history: History, rng: random.Random, done: asyncio.Event
) -> Counter[str]:
    """Wait for a call of a chosen kind to be in flight, kill the service a few ms later, restart it."""
    kills: Counter[str] = Counter()
    while sum(kills.values()) < KILLS and not done.is_set():
        await asyncio.sleep(rng.uniform(0.5, 1.2))
        target = TARGETS[sum(kills.values()) % len(TARGETS)]
        for _ in range(400):  # up to ~2 s for such a call to be in flight
            if done.is_set() or any(c.kind == target and c.outcome == "invoked" for c in history.calls[-64:]):
                break
            await asyncio.sleep(0.005)
        if done.is_set():
            break
        await asyncio.sleep(rng.uniform(0, 0.012))  # before, during or after its commit
        service.kill()
        kills[target] += 1
        await asyncio.sleep(rng.uniform(0, 0.3))
        await service.start()
    return kills


async def _open(db_url: str) -> int:
    owner = await asyncpg.connect(db_url)
    try:
        return int(
            await owner.fetchval(
                "SELECT count(*) FROM ledger.operations WHERE status IN ('pending', 'submitted')"
            )
        )
    finally:
        await owner.close()


def _landed_before_the_kill(history: History) -> Counter[str]:
    """Calls cut mid-request whose retry found the transition already made: the answer was lost after
    the commit (a claim replayed by its nonce; a submit or complete already recorded before the retry)."""
    landed: Counter[str] = Counter()
    calls = history.calls
    for index, cut in enumerate(calls):
        if cut.outcome != "unknown" or cut.kind not in TARGETS or cut.error == "ConnectError":
            continue
        retry: Call | None = next(
            (
                c
                for c in calls[index + 1 :]
                if c.operation_id == cut.operation_id and c.kind == cut.kind and c.outcome == "ok"
            ),
            None,
        )
        if retry is None or not isinstance(retry.body, dict):
            continue
        moment = retry.body.get("submitted_at" if cut.kind == "submit" else "resolved_at")
        if cut.kind == "claim" and retry.replayed:
            landed["claim"] += 1
        elif cut.kind != "claim" and moment and parse_ts(moment).timestamp() < retry.wall:
            landed[cut.kind] += 1
    return landed


async def test_service_killed_mid_request_executes_each_effect_at_most_once(
    request: pytest.FixtureRequest, db_url: str
) -> None:
    history = History()
    rng = random.Random(7)
    with scenario(request, "service_sigkill") as figures:
        async with (
            Sink() as sink,
            ServiceProcess(db_url, background_sweep="true", sweep_interval_seconds=1) as service,
        ):
            ids = [f"kill-{n}" for n in range(OPERATIONS)]
            async with executor_clients(service.base_url, history, EXECUTORS) as clients:
                tally, kills = await run_beside_fault(
                    clients,
                    sink,
                    ids,
                    LEASE_SECONDS,
                    scale(110, 1300),
                    lambda done: _kill_mid_request(service, history, rng, done),
                )
            # every abandoned lease has run out and the service's sweeper stored it unknown (the state a
            # passing run ends in; a sweeper that never gets there fails here, and check_run says why)
            await until(
                lambda: _open(db_url), "no operation left pending or submitted", holds=lambda n: n == 0
            )
            reconciled = await reconcile(service.base_url, history, sink)
            state = await read_state(db_url)
        figures.faults = sum(kills.values())
        cut = Counter(c.kind for c in history.calls if c.outcome == "unknown" and c.error != "ConnectError")
        refused = sum(1 for c in history.calls if c.error == "ConnectError")
        figures.extra = {
            "effects": len(ids),
            "kills": dict(kills),
            "calls_cut": dict(cut),
            "calls_refused": refused,
            "answer_lost_after_commit": dict(_landed_before_the_kill(history)),
        }
        figures.executed(history, sink, tally.outcomes, reconciled)
        figures.check_run(history, state, sink, swept=True)
        if tally.outcomes["gave_up"]:
            figures.violations.append(f"{tally.outcomes['gave_up']} operations never finished")
    assert figures.faults == KILLS
    assert len(state.operations) == len(ids) >= OPERATIONS
    figures.assert_clean()
