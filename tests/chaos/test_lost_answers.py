"""Scenario 5: a proxy between executors and the service drops a fraction of the answers after the
request was served. Retried calls must replay, not repeat: zero duplicate effects, identical receipts."""

from __future__ import annotations

from typing import Any

import pytest

from effect_ledger.client import LedgerClient
from support.harness import Sink, chaos_settings, read_state, scale, scenario, timeout
from support.processes import LossyProxy
from support.recording import History
from support.server import Service
from support.workload import TOOL, TOOL_VERSION, executor_clients, reconcile, run_executors

pytestmark = [pytest.mark.chaos, timeout(120, 1200)]

OPERATIONS = scale(120, 1500)
EXECUTORS = 8
DROP_FRACTION = 0.25
LEASE_SECONDS = 10


async def test_lost_answers_never_duplicate_an_effect(request: pytest.FixtureRequest, db_url: str) -> None:
    history = History()
    with scenario(request, "lost_answers") as figures:
        async with (
            Sink() as sink,
            Service(chaos_settings(db_url, pool_size=10)) as service,
            LossyProxy(service.port, DROP_FRACTION, seed=5) as proxy,
        ):
            ids = [f"lost-{n}" for n in range(OPERATIONS)]
            async with executor_clients(proxy.url, history, EXECUTORS, keepalive=False) as clients:
                tally = await run_executors(clients, sink, "t1", ids, LEASE_SECONDS, scale(100, 1100))
                replays = await _replay_everything(clients[0], history, ids)
            reconciled = await reconcile(service.base_url, history, sink)
            state = await read_state(db_url)
        figures.faults = proxy.dropped
        figures.extra = {
            "effects": OPERATIONS,
            "answers_dropped": proxy.dropped,
            "requests_forwarded": proxy.forwarded,
            "claims_replayed_by_nonce": sum(1 for c in history.calls if c.replayed),
            "receipt_replays": len(replays),
        }
        figures.executed(history, sink, tally.outcomes, reconciled)
        for operation_id, receipts in replays.items():
            if receipts[0] is None or any(r != receipts[0] for r in receipts):
                figures.violations.append(f"{operation_id}: replays answered different receipts {receipts}")
        figures.check_run(history, state, sink, allowed_5xx=frozenset())
    figures.assert_clean()
    assert proxy.dropped > 0
    assert sink.total == OPERATIONS and len(replays) == OPERATIONS


async def _replay_everything(client: LedgerClient, history: History, ids: list[str]) -> dict[str, list[Any]]:
    """Claim every ID again and read it, through the lossy proxy: each answer must show the receipt
    that the executor's complete was first answered with (compared as the JSON that was sent)."""
    told: dict[str, Any] = {}
    for call in history.calls:
        if call.kind == "complete" and call.outcome == "ok" and call.operation_id not in told:
            told[str(call.operation_id)] = call.body["receipt"]
    receipts: dict[str, list[Any]] = {}
    for operation_id in ids:
        mark = len(history.calls)
        again = await client.claim(
            operation_id, tool=TOOL, tool_version=TOOL_VERSION, intent={"operation": operation_id}
        )
        await client.get_operation(operation_id)
        assert again.action == "reuse_receipt"
        answers = [c.body for c in history.calls[mark:] if c.outcome == "ok"]
        shown = [a["operation"]["receipt"] if "action" in a else a["receipt"] for a in answers]
        receipts[operation_id] = [told.get(operation_id), *shown]
    return receipts
