"""The repository's view of a fresh claim matches what it stored: row, chain head and first event."""

from __future__ import annotations

import asyncpg

from effect_ledger.db import ledger as repo
from effect_ledger.db.pools import Pools
from effect_ledger.domain.chain import GENESIS_HASH, first_bad_seq
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.model import Binding
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
