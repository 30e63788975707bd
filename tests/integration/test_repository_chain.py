"""The repository's view of a fresh claim matches what it stored: row, chain head and first event."""

from __future__ import annotations

import asyncpg

from effect_ledger.db import ledger as repo
from effect_ledger.db.pools import Pools
from effect_ledger.domain.chain import GENESIS_HASH, first_bad_seq
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.model import Binding
from effect_ledger.domain.transitions import Report
from effect_ledger.settings import Settings


async def test_created_claim_carries_the_stored_chain_head(settings: Settings, db_url: str) -> None:
    pools = await Pools.open(settings, reader=False)
    try:
        ledger = repo.Ledger(pools.runtime, pools.acquire_timeout)
        req = ClaimRequest("op-head", Binding("exec-1", "t", "1", "sha256:" + "c" * 64), 30, None)
        result = await repo.claim(ledger, "t1", req, None)
        events = await repo.list_events(ledger, "t1", "op-head")
    finally:
        await pools.close()
    assert result.verdict == "created"
    conn = await asyncpg.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT chain_seq, chain_hash FROM ledger.operations WHERE tenant_id = 't1' AND operation_id = 'op-head'"
        )
    finally:
        await conn.close()
    assert (result.operation.last_seq, result.operation.last_hash) == (row["chain_seq"], row["chain_hash"])
    assert [(e["seq"], e["prev_hash"], e["hash"]) for e in events] == [(1, GENESIS_HASH, row["chain_hash"])]
    assert first_bad_seq([{**e, "operation_id": "op-head"} for e in events]) == (1, None)


async def test_write_answers_name_their_events_without_the_hot_ones_data(settings: Settings) -> None:
    """The events a write-path call answers (what the metrics and spans read): a claimed, submitted or
    completed event as kind, statuses and attempt, without its actor and data (migration 0021: the
    completed event's data is the whole receipt, which the answer's row carries); a discrepancy, a cold
    transition's event, whole, so that its `source` is counted."""
    pools = await Pools.open(settings, reader=False)
    try:
        ledger = repo.Ledger(pools.runtime, pools.acquire_timeout)
        binding = Binding("exec-1", "t", "1", "sha256:" + "d" * 64)
        req = ClaimRequest("op-ev", binding, 30, None, submit=True, effect_ref="ref-1")
        claimed = await repo.claim(ledger, "t1", req, None)
        assert claimed.token is not None
        receipt = {"external_ref": "m-1", "result": {"value": 1}, "result_digest": None, "observed_at": None}
        done = await repo.complete(
            ledger, "t1", "op-ev", "exec-1", claimed.token, Report("committed", receipt)
        )
        differs = await repo.complete(
            ledger,
            "t1",
            "op-ev",
            "exec-1",
            claimed.token,
            Report("not_applied", None, {"category": "rejected"}),
        )
    finally:
        await pools.close()
    shape = [(e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data) for e in claimed.events]
    assert shape == [
        ("claimed", "", None, "pending", 1, {}),
        ("submitted", "", "pending", "submitted", 1, {}),
    ]
    assert [(e.kind, e.actor, e.from_status, e.to_status, e.data) for e in done.events] == [
        ("completed", "", "submitted", "committed", {})
    ]
    assert done.operation is not None and done.operation.receipt is not None
    assert done.operation.receipt["external_ref"] == "m-1"  # the receipt comes with the row
    assert differs.refusal is not None and differs.refusal.code == "conflicting_outcome"
    (discrepancy,) = differs.events
    assert (discrepancy.kind, discrepancy.actor) == ("discrepancy", "exec-1")
    assert discrepancy.data["recorded_outcome"] == "committed"
    assert discrepancy.data["reported_outcome"] == "not_applied"
