"""The bench's wait before a row with the receipts log on (loglag.settle): until the log holds every
receipt committed before and a checkpoint covers them, so that the row's window pays neither for
integrating nor for checking and signing the receipts an earlier row committed with the log off."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

from effect_ledger.db import receipt_log
from effect_ledger.db.maintenance import owner_connection
from effect_ledger.settings import Settings
from effect_ledger.signer import signer_from_settings
from effect_ledger_bench.logcpu import commit
from effect_ledger_bench.loglag import settle, settled_note
from effect_ledger_bench.workload import TENANT
from support.receipt_log import log_settings

RECEIPTS = 30


async def test_settle_waits_for_the_checkpoint_as_well_as_the_integrator(
    settings: Settings, tmp_path: Path
) -> None:
    logged = log_settings(settings, tmp_path)
    await commit(replace(logged, log_enabled=False), secrets.token_urlsafe(48), RECEIPTS, "settle")
    url = logged.database_url
    assert url is not None
    waited, done = await settle(url, TENANT, limit=0.3)
    assert not done and waited >= 0.3  # nothing logged yet: it waited its whole limit
    conn = await owner_connection(logged)
    guard = receipt_log.LogGuard()
    try:
        assert await receipt_log.integrate(conn, logged.log_batch_size, guard) == "done"
        waited, done = await settle(url, TENANT, limit=0.3)
        assert not done and waited >= 0.3  # every receipt logged, none signed yet: still waiting
        config = receipt_log.LogConfig(logged.log_origin, 0)
        signed = await receipt_log.checkpoint(conn, signer_from_settings(logged), config, guard)
        assert [size for _, size in signed] == [RECEIPTS]
    finally:
        await conn.close()
    waited, done = await settle(url, TENANT, limit=5.0)
    assert done and waited < 1.0
    assert (await settled_note(url, TENANT)).startswith("; log caught up and signed in ")
