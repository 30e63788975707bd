"""Sweep and purge against real PostgreSQL: what they touch, batches, SKIP LOCKED, the advisory lock,
a non-superuser owner under forced RLS, the CLI, and the background task of serve."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from effect_ledger.db.maintenance import PURGE_LOCK, SWEEP_LOCK, purge, sweep
from effect_ledger.db.migrate import migrate
from effect_ledger.settings import Settings
from support.database import with_database
from support.ledger import (
    AUDITOR,
    Seed,
    committed,
    count_events,
    events_of,
    expire_lease,
    get,
    not_applied,
    owner,
    pending,
    seed,
    stored_status,
    submitted,
    unknown,
)
from support.server import Service
from support.waiting import until

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


async def backdate(db_url: str, days: int, *ops: str) -> None:
    """Make operations look untouched for `days` days."""
    async with owner(db_url) as conn:
        await conn.execute(
            "UPDATE ledger.operations SET updated_at = now() - make_interval(days => $1)"
            " WHERE operation_id = ANY($2::text[])",
            days,
            list(ops),
        )


async def test_sweep_marks_exactly_the_expired_submitted_ones(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    for tenant in ("t1", "t2"):
        await submitted(client, "expired", tenant)
        await expire_lease(db_url, "expired", tenant)
    await submitted(client, "live")
    await pending(client, "pending-expired")
    await expire_lease(db_url, "pending-expired")
    await unknown(client, "reported")
    await committed(client, "done")
    events_before = await count_events(db_url)

    result = await sweep(settings)
    assert result.summary() == {
        "task": "sweep",
        "skipped": False,
        "batches": 1,
        "swept": 2,
        "approvals_expired": 0,
    }
    for tenant in ("t1", "t2"):
        assert await stored_status(db_url, "expired", tenant) == "unknown"
        last = (await events_of(db_url, "expired", tenant))[-1]
        assert (
            last["seq"],
            last["kind"],
            last["actor"],
            last["from_status"],
            last["to_status"],
            last["attempt"],
        ) == (3, "lease_expired", "effect-ledger", "submitted", "unknown", 1)
        assert set(last["data"]) == {"lease_expires_at"}
    assert [await stored_status(db_url, op) for op in ("live", "pending-expired", "reported", "done")] == [
        "submitted",
        "pending",
        "unknown",
        "committed",
    ]
    assert await count_events(db_url) == events_before + 2
    r = await get(client, "/v1/audit/verify", **AUDITOR)
    assert r.json()["ok"] is True

    again = await sweep(settings)
    assert again.summary() == {
        "task": "sweep",
        "skipped": False,
        "batches": 1,
        "swept": 0,
        "approvals_expired": 0,
    }
    assert await count_events(db_url) == events_before + 2


async def test_sweep_works_in_batches_and_skips_rows_a_request_holds(db_url: str, settings: Settings) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    async with owner(db_url) as conn:
        await seed(conn, [Seed(f"t{i % 3}", f"old-{i:03d}", "submitted", past, past) for i in range(230)])
    holder = await asyncpg.connect(db_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "SELECT 1 FROM ledger.operations WHERE tenant_id = 't1' AND operation_id = 'old-007' FOR UPDATE"
        )
        result = await asyncio.wait_for(sweep(replace(settings, sweep_batch_size=100)), timeout=30)
        assert (result.batches, result.counts["swept"]) == (3, 229)
        assert await stored_status(db_url, "old-007", "t1") == "submitted"
        await tx.rollback()
    finally:
        await holder.close()
    result = await sweep(settings)
    assert result.counts["swept"] == 1
    assert await stored_status(db_url, "old-007", "t1") == "unknown"


async def test_the_advisory_lock_makes_a_second_run_skip(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await submitted(client, "expired")
    await expire_lease(db_url, "expired")
    await committed(client, "old")
    await backdate(db_url, 40, "old")
    other_replica = await asyncpg.connect(db_url)
    try:
        assert await other_replica.fetchval("SELECT pg_try_advisory_lock($1, $2)", *SWEEP_LOCK)
        assert (await sweep(settings)).summary() == {
            "task": "sweep",
            "skipped": True,
            "batches": 0,
            "swept": 0,
        }
        assert await stored_status(db_url, "expired") == "submitted"
        # the purge has its own lock, so it still runs
        assert (await purge(settings)).counts["operations"] == 1
        assert await other_replica.fetchval("SELECT pg_try_advisory_lock($1, $2)", *PURGE_LOCK)
        assert (await purge(settings)).skipped is True
        await other_replica.execute("SELECT pg_advisory_unlock_all()")
    finally:
        await other_replica.close()
    # two sweeps at once: both return, and the operation is swept exactly once
    first, second = await asyncio.gather(sweep(settings), sweep(settings))
    assert first.counts["swept"] + second.counts["swept"] == 1
    assert [e["kind"] for e in await events_of(db_url, "expired")].count("lease_expired") == 1


async def test_purge_deletes_only_old_terminal_operations_and_their_events(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await committed(client, "old-committed")
    await committed(client, "old-committed", tenant="t2")
    await not_applied(client, "old-not-applied")
    await committed(client, "new-committed")
    await committed(client, "edge-committed")
    await pending(client, "old-pending")
    await submitted(client, "old-submitted")
    await unknown(client, "old-unknown")
    await backdate(
        db_url, 40, "old-committed", "old-not-applied", "old-pending", "old-submitted", "old-unknown"
    )
    await backdate(db_url, 29, "edge-committed")
    before = await count_events(db_url)

    result = await purge(settings)
    assert (result.skipped, result.batches, result.counts["operations"], result.counts["events"]) == (
        False,
        1,
        3,
        6,
    )
    async with owner(db_url) as conn:
        left = await conn.fetch(
            "SELECT tenant_id, operation_id, receipt IS NULL AND not_applied_reason IS NULL AS tombstone,"
            " (SELECT count(*) FROM ledger.events e WHERE e.tenant_id = o.tenant_id"
            " AND e.operation_id = o.operation_id) AS events FROM ledger.operations o ORDER BY 1, 2"
        )
    # the old terminal ones are tombstones now (API.md 9a): no events, the row itself stays
    tombstones = {("t1", "old-committed"), ("t1", "old-not-applied"), ("t2", "old-committed")}
    assert {
        (r["tenant_id"], r["operation_id"])
        for r in left
        if r["tombstone"] and r["operation_id"].startswith("old-") and r["events"] == 0
    } == tombstones
    assert [
        (r["tenant_id"], r["operation_id"])
        for r in left
        if (r["tenant_id"], r["operation_id"]) not in tombstones
    ] == [
        ("t1", op)
        for op in ("edge-committed", "new-committed", "old-pending", "old-submitted", "old-unknown")
    ]
    assert await count_events(db_url) == before - 6
    assert (await get(client, "/v1/audit/verify", **AUDITOR)).json()["ok"] is True
    again = await purge(settings)
    assert (again.counts["operations"], again.counts["events"]) == (0, 0)
    shorter = await purge(replace(settings, retention_days=7))
    assert shorter.counts["operations"] == 1  # edge-committed, 29 days old


async def test_purge_works_in_bounded_batches(db_url: str, settings: Settings) -> None:
    old = datetime.now(UTC) - timedelta(days=60)
    async with owner(db_url) as conn:
        await seed(
            conn, [Seed("t1", f"c-{i:03d}", ("committed", "not_applied")[i % 2], old) for i in range(250)]
        )
        await seed(conn, [Seed("t1", f"u-{i:03d}", "unknown", old) for i in range(20)])
    result = await purge(replace(settings, purge_batch_size=100))
    assert (result.batches, result.counts["operations"]) == (3, 250)
    async with owner(db_url) as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM ledger.operations WHERE receipt IS NOT NULL OR not_applied_reason IS NOT NULL"
                " OR status NOT IN ('committed', 'not_applied')"
            )
            == 20
        )


async def test_sweep_and_purge_as_a_non_superuser_owner_under_forced_rls(
    pg_admin_url: str, db_url: str
) -> None:
    """The managed-PostgreSQL case: the owner is bound by forced RLS; policy `maintenance` lets it work."""
    admin = await asyncpg.connect(pg_admin_url)
    name = db_url.rsplit("/", 1)[1].split("?")[0] + "_owned"
    try:
        await admin.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'el_owner') THEN"
            " CREATE ROLE el_owner LOGIN PASSWORD 'el-owner-pw'; END IF; END $$"
        )
        await admin.execute(f'CREATE DATABASE "{name}" OWNER el_owner')
        parts = urlsplit(with_database(pg_admin_url, name))
        port = f":{parts.port}" if parts.port else ""
        owner_url = urlunsplit(parts._replace(netloc=f"el_owner:el-owner-pw@{parts.hostname or ''}{port}"))
        # explicit role URLs: the service roles exist already and this owner may not set their passwords
        settings = Settings(
            database_url=owner_url,
            runtime_database_url="postgresql://unused",
            reader_database_url="postgresql://unused",
        )
        await asyncio.to_thread(lambda: asyncio.run(migrate(settings)))
        async with owner(owner_url) as conn:
            assert (
                await conn.fetchval(
                    "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
                )
                is False
            )
            past = datetime.now(UTC) - timedelta(days=60)
            for tenant in ("t1", "t2"):
                async with conn.transaction():
                    await conn.execute("SELECT set_config('effect_ledger.tenant', $1, true)", tenant)
                    await seed(
                        conn,
                        [
                            Seed(tenant, "stuck", "submitted", past, past),
                            Seed(tenant, "done", "committed", past, updated_at=past),
                        ],
                        copy=False,
                    )
            # without maintenance scope, forced RLS hides every row from the owner
            assert await conn.fetchval("SELECT count(*) FROM ledger.operations") == 0
            assert (await sweep(settings)).counts["swept"] == 2
            assert (await purge(settings)).counts["operations"] == 2
            async with conn.transaction():
                await conn.execute("SELECT set_config('effect_ledger.maintenance', 'on', true)")
                rows = await conn.fetch(
                    "SELECT tenant_id, operation_id, status, receipt IS NULL AS purged FROM ledger.operations"
                    " ORDER BY 1, 2"
                )
                kinds = await conn.fetch("SELECT tenant_id, kind, actor FROM ledger.events ORDER BY 1")
            assert [tuple(r) for r in rows] == [
                ("t1", "done", "committed", True),
                ("t1", "stuck", "unknown", True),
                ("t2", "done", "committed", True),
                ("t2", "stuck", "unknown", True),
            ]
            assert [tuple(r) for r in kinds] == [
                ("t1", "lease_expired", "effect-ledger"),
                ("t2", "lease_expired", "effect-ledger"),
            ]
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def run_cli(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "effect-ledger"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def test_cli_runs_one_sweep_and_one_purge(client: httpx.AsyncClient, db_url: str) -> None:
    await submitted(client, "expired")
    await expire_lease(db_url, "expired")
    await committed(client, "old")
    await backdate(db_url, 3, "old")
    sweep_out = await asyncio.to_thread(run_cli, "sweep", "--database-url", db_url)
    assert sweep_out == {"task": "sweep", "skipped": False, "batches": 1, "swept": 1, "approvals_expired": 0}
    purge_out = await asyncio.to_thread(run_cli, "purge", "--database-url", db_url, "--retention-days", "2")
    assert purge_out["operations"] == 1 and purge_out["events"] == 2 and purge_out["skipped"] is False
    assert (
        await stored_status(db_url, "expired") == "unknown"
        and await stored_status(db_url, "old") == "committed"
    )
    assert purge_out["tombstones_expired"] == 0


async def test_serve_sweeps_in_the_background(settings: Settings, db_url: str) -> None:
    background = replace(settings, background_sweep=True, sweep_interval_seconds=1)
    async with Service(background) as service, service.client() as http:
        await submitted(http, "expired")
        await expire_lease(db_url, "expired")
        await until(
            lambda: stored_status(db_url, "expired"), "the sweep's expiry", holds=lambda s: s == "unknown"
        )
        kinds = [e["kind"] for e in await events_of(db_url, "expired")]
        assert kinds == ["claimed", "submitted", "lease_expired"]


async def test_an_expired_tombstone_never_sequenced_leaves_no_pending_feed_row(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    """Nothing read the feed for the whole retention (the log off, no follower): the committed
    operation's place in ledger.feed_pending outlives its receipt. When the tombstone expires, the
    place goes with the row; left behind, it would be given a position with no operation behind it,
    and the log's integrator stops at such a gap for good. The feed then numbers the rest gap-free."""
    for op in ("gone", "kept"):
        await committed(client, op)
    await backdate(db_url, 400, "gone")
    pending_rows = "SELECT operation_id FROM ledger.feed_pending WHERE tenant_id = 't1' ORDER BY operation_id"
    async with owner(db_url) as conn:
        assert [r["operation_id"] for r in await conn.fetch(pending_rows)] == ["gone", "kept"]
    result = await purge(settings)  # tombstoned (retention), then deleted (tombstone horizon), in one run
    assert (result.counts["operations"], result.counts["tombstones_expired"]) == (1, 1)
    async with owner(db_url) as conn:
        assert [r["operation_id"] for r in await conn.fetch(pending_rows)] == ["kept"]
    feed = (await get(client, "/v1/receipts")).json()
    assert [(item["operation_id"], int(item["position"])) for item in feed["items"]] == [("kept", 1)]
