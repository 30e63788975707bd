"""The receipts log through an ID's whole life under API.md section 9a: purged, expired, claimed anew.
Each path is legitimate, so none may stop the tenant's log or raise a refusal (found in review,
round 24; each test fails on the code before it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from effect_ledger.settings import Settings
from support.ledger import (
    AUDITOR,
    CLAIM,
    RECEIPT,
    call,
    claim,
    committed,
    get,
    not_applied,
    owner,
    wait_for_size,
)
from support.receipt_log import integrate_twice, log_settings, purge_beside_the_next_check
from support.server import Service

pytestmark = [pytest.mark.timeout(180), pytest.mark.storage]


async def aged_then_logged(settings: Settings, db_url: str, interval: str) -> None:
    """op-x and op-y committed with the log off, op-x's commit and last change moved `interval` into the
    past (so its leaf carries the old commit time, as it would have), then both logged and signed."""
    async with Service(settings) as off, off.client() as client:
        await committed(client, "op-x")
        await committed(client, "op-y")
    async with owner(db_url) as su:
        await su.execute(
            f"UPDATE ledger.operations SET updated_at = now() - interval '{interval}',"
            f" resolved_at = now() - interval '{interval}' WHERE tenant_id = 't1' AND operation_id = 'op-x'"
        )


async def test_an_id_claimed_anew_after_its_tombstone_expired_keeps_the_log_signing(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """After TOMBSTONE_DAYS the ID vanishes and may be claimed anew; its old leaf stays in the log and
    its new commit is a new leaf. The checkpointer's audit compared the old leaf with the new row, found
    another receipt (`receipt_mismatch`) and never signed the tenant again."""
    from effect_ledger.db.maintenance import purge

    await aged_then_logged(settings, db_url, "500 days")
    conf = log_settings(settings, tmp_path)
    async with Service(conf) as running, running.client() as client:
        await wait_for_size(client, 2)
        counts = (await purge(conf)).counts
        assert (counts["operations"], counts["tombstones_expired"]) == (1, 1), counts
        assert (await get(client, "/v1/operations/op-x", **AUDITOR)).status_code == 404
        await committed(client, "op-x", receipt={"external_ref": "second-life", "result": None})
        await committed(client, "op-z")
        await wait_for_size(client, 4)
        view = (await get(client, "/v1/operations/op-x", **AUDITOR)).json()
        assert view["log_index"] == 2


async def test_a_tombstone_expired_under_the_shortest_settings_is_no_deletion(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """RETENTION_DAYS = TOMBSTONE_DAYS = 1 (allowed), both counted from the row's last change: a row
    gone 25 hours after its commit expired. Until round 24 the checkpointer took any row gone within
    two days for a deletion (`receipt_missing`) and left the tenant unsigned."""
    from effect_ledger.db.maintenance import purge

    await aged_then_logged(settings, db_url, "25 hours")
    conf = log_settings(settings, tmp_path, retention_days=1, tombstone_days=1)
    async with Service(conf) as running, running.client() as client:
        await wait_for_size(client, 2)
        counts = (await purge(conf)).counts
        assert (counts["operations"], counts["tombstones_expired"]) == (1, 1), counts
        await committed(client, "op-z")
        await wait_for_size(client, 3)


async def test_an_id_purged_twice_while_its_batch_is_checked_raises_no_alarm(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As test_receipt_log's purge race, for an ID purged once already (not_applied, purged, claimed
    anew and committed) and purged again between the batch's two reads: the pass stops in front of it
    without a `receipt_mismatch` refusal (an alert), and the next pass logs its tombstone."""
    from effect_ledger.db.maintenance import owner_connection, purge

    async def age() -> None:
        async with owner(db_url) as aged:
            await aged.execute("UPDATE ledger.operations SET updated_at = now() - make_interval(days => 40)")

    async with Service(settings) as off, off.client() as client:  # the log is not running
        await not_applied(client, "op-0")
        await age()
        assert (await purge(settings)).counts["operations"] == 1
        r = await claim(client, "op-0", {**CLAIM})
        assert r.status_code == 201, r.text
        done = {"token": r.json()["claim"]["token"], "outcome": "committed", "receipt": RECEIPT}
        assert (await call(client, "op-0", "complete", done)).status_code == 200
    await age()
    purge_beside_the_next_check(monkeypatch, settings, 1)
    conn = await owner_connection(settings)
    try:
        assert await integrate_twice(conn) == (0, 1, [])
    finally:
        await conn.close()


async def test_integration_passes_take_the_tenants_round_robin(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass takes at most TENANTS_A_PASS tenants (1000; 1 here), the next starting after the last one
    the previous took. Until round 24 the query had no order: with more tenants waiting than that, some
    stuck (behind the signer, here t1), every pass could take the same ones and starve the rest."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import owner_connection

    async with Service(settings) as off, off.client() as client:  # the log is not running
        for tenant in ("t1", "t2", "t3"):
            await committed(client, "op-0", tenant=tenant)
    monkeypatch.setattr(receipt_log, "TENANTS_A_PASS", 1)
    guard = receipt_log.LogGuard(behind={"t1": (0, 5)})  # t1 waits for log-recover: skipped every pass
    conn = await owner_connection(settings)
    try:
        for _ in range(3):
            await receipt_log.integrate(conn, 50, guard)
        sizes = await conn.fetch("SELECT tenant_id, size FROM ledger.log_state ORDER BY tenant_id")
    finally:
        await conn.close()
    assert [tuple(r) for r in sizes] == [("t2", 1), ("t3", 1)]
