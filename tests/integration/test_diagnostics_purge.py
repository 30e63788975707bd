"""Diagnostics retention: incidents after diagnostics_retention_days, access-log rows after a year."""

from __future__ import annotations

from dataclasses import replace

import asyncpg
import pytest

from effect_ledger.db import diagnostics
from effect_ledger.db.maintenance import purge
from effect_ledger.settings import Settings

INCIDENT = (
    "INSERT INTO diagnostics.incidents (tenant_id, incident_id, source, created_at)"
    " VALUES ($1, $2, 'report', now() - make_interval(days => $3))"
)
ACCESS = (
    "INSERT INTO diagnostics.access_log (tenant_id, access_id, incident_id, principal, purpose, at)"
    " VALUES ($1, $2, 'inc_x', 'auditor', 'review', now() - make_interval(days => $3))"
)


async def seed(conn: asyncpg.Connection) -> None:
    """Incidents 15 and 13 days old and access rows 366 and 364 days old, in two tenants."""
    for tenant in ("t1", "t2"):
        await conn.execute(INCIDENT, tenant, f"inc_{tenant}_old_0123456789ab", 15)
        await conn.execute(INCIDENT, tenant, f"inc_{tenant}_new_0123456789ab", 13)
        await conn.execute(ACCESS, tenant, f"acc_{tenant}_old", 366)
        await conn.execute(ACCESS, tenant, f"acc_{tenant}_new", 364)


async def remaining(conn: asyncpg.Connection) -> tuple[list[str], list[str]]:
    incidents = await conn.fetch("SELECT incident_id FROM diagnostics.incidents ORDER BY incident_id")
    access = await conn.fetch("SELECT access_id FROM diagnostics.access_log ORDER BY access_id")
    return [r[0] for r in incidents], [r[0] for r in access]


async def test_purge_removes_only_expired_diagnostics(settings: Settings) -> None:
    assert (settings.diagnostics_retention_days, settings.access_log_retention_days) == (14, 365)
    conn = await asyncpg.connect(settings.database_url)
    try:
        await seed(conn)
        purged = await diagnostics.purge_diagnostics(conn, settings)
        assert (purged.incidents, purged.access_log) == (2, 2)
        assert await remaining(conn) == (
            ["inc_t1_new_0123456789ab", "inc_t2_new_0123456789ab"],
            ["acc_t1_new", "acc_t2_new"],
        )
        # A shorter configured retention takes the rest; running again finds nothing more.
        shorter = replace(settings, diagnostics_retention_days=7, access_log_retention_days=30)
        assert await diagnostics.purge_diagnostics(conn, shorter) == diagnostics.DiagnosticsPurge(2, 2)
        assert await diagnostics.purge_diagnostics(conn, shorter) == diagnostics.DiagnosticsPurge(0, 0)
    finally:
        await conn.close()


async def test_purge_in_batches(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        for n in range(7):
            await conn.execute(INCIDENT, "t1", f"inc_batch_{n:02d}_0123456789", 20)
        monkeypatch.setattr(diagnostics, "PURGE_BATCH", 3)  # 3 + 3 + 1: three transactions
        assert (await diagnostics.purge_diagnostics(conn, settings)).incidents == 7
        assert await remaining(conn) == ([], [])
    finally:
        await conn.close()


async def test_the_purge_command_includes_diagnostics(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await seed(conn)
    finally:
        await conn.close()
    result = await purge(settings)
    assert (result.counts["incidents"], result.counts["access_log"]) == (2, 2)
