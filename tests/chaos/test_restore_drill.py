"""Restore drill: point-in-time recovery of a backup taken mid-run, into a new server, served again.

The primary archives its WAL (archive_command, as the Barman Cloud plugin does to object storage);
executors run full cycles; mid-run `pg_basebackup` takes a base backup (WAL from the archive only,
`-X none`); later a restore point is chosen, the load goes on past it, the last WAL segment is
archived and the primary stopped. The backup is restored into a new server with `restore_command`
and `recovery_target_time` = the restore point, promoted at the target, and the service started on
it. What a restored-to-the-past ledger means (README, "Backups and restore"):

- every transition acknowledged before the restore point is there, with the same receipt, and
  every hash chain verifies;
- nothing recorded after the restore point is: an operation first claimed after it is unknown
  (404) to the restored ledger, and claiming it again grants a new attempt: to the restored ledger
  it was never executed. That is why a restore is announced to executors and reconcilers, and why
  the verifiable log's rollback detection refuses to serve such a ledger as new.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from datetime import UTC, datetime

import pytest

from effect_ledger.domain.timefmt import parse_ts
from effect_ledger.settings import Settings
from support.auth import token
from support.durability import ACKNOWLEDGED, ended_at, lost_acknowledged
from support.harness import (
    TOOL,
    TOOL_VERSION,
    Sink,
    check_ledger,
    read_state,
    scale,
    scenario,
    timeout,
)
from support.recording import History
from support.replication import Node, Template, give, run, scratch_root, wait_writable
from support.server import Service
from support.workload import ledger_client, run_executors

pytestmark = [pytest.mark.chaos, timeout(150, 900)]

EXECUTORS = 6
LEASE_SECONDS = 10
BEFORE_BACKUP_SECONDS = scale(1, 10)
BACKUP_TO_TARGET_SECONDS = scale(1, 10)
AFTER_TARGET_SECONDS = scale(1, 10)
CLOCK_SLACK_SECONDS = 0.005


async def archive_everything(primary: Node, within: float = 30) -> str:
    """Switch to a new WAL segment and wait until the archiver has copied the finished one."""
    conn = await primary.owner()
    try:
        segment = await conn.fetchval("SELECT pg_walfile_name(pg_switch_wal())")
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            archived = await conn.fetchval("SELECT last_archived_wal FROM pg_stat_archiver")
            if archived is not None and archived >= segment:
                return str(segment)
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    raise AssertionError(f"WAL segment {segment} was not archived within {within} s")


async def test_a_backup_taken_mid_run_restores_to_a_point_in_time_and_serves(
    request: pytest.FixtureRequest, pg_template: Template
) -> None:
    root = scratch_root()
    archive = root / "archive"
    archive.mkdir()
    give(archive)
    primary = pg_template.copy(root, "primary")
    primary.configure(archive_mode="on", archive_command=f"test ! -f {archive}/%f && cp %p {archive}/%f")
    restored = Node(root, "restored")  # pg_basebackup writes its data directory
    history = History()
    settings = Settings(
        database_url=primary.url(),
        background_sweep=False,
        rate_limit_per_second=0,
        pool_size=8,
        log_level="warning",
    )
    try:
        await asyncio.to_thread(primary.start)
        with scenario(request, "restore_drill") as figures:
            async with Sink() as sink, Service(settings) as service:
                stop = asyncio.Event()
                clients = [ledger_client(service.base_url, history) for _ in range(EXECUTORS)]
                work = asyncio.create_task(
                    run_executors(
                        clients,
                        sink,
                        "t1",
                        [f"pitr-{n}" for n in range(EXECUTORS)],
                        LEASE_SECONDS,
                        120,
                        lambda n: None if stop.is_set() else f"pitr-{n}",
                    )
                )
                try:
                    await asyncio.sleep(BEFORE_BACKUP_SECONDS)
                    backup_started = time.monotonic()
                    await asyncio.to_thread(
                        run, "pg_basebackup", "-D", str(restored.data), "-h", "127.0.0.1", "-p", str(primary.port),
                        "-U", "postgres", "-X", "none", "-c", "fast", "--no-sync",
                    )  # fmt: skip
                    backup_seconds = time.monotonic() - backup_started
                    await asyncio.sleep(BACKUP_TO_TARGET_SECONDS)
                    target = time.time()  # the restore point
                    await asyncio.sleep(AFTER_TARGET_SECONDS)
                    stop.set()
                    await work
                finally:
                    stop.set()
                    for client in clients:
                        await client.aclose()
            await archive_everything(primary)
            original = await read_state(primary.url())
            await asyncio.to_thread(primary.stop)

            restored.configure(
                archive_mode="off",
                restore_command=f"cp {archive}/%f %p",
                recovery_target_time=datetime.fromtimestamp(target, UTC).isoformat(sep=" "),
                recovery_target_action="promote",
            )
            (restored.data / "recovery.signal").touch()
            give(restored.data)
            recovery_started = time.monotonic()
            await asyncio.to_thread(restored.start)
            await wait_writable(restored)
            recovery_seconds = time.monotonic() - recovery_started
            state = await read_state(restored.url())

            # The ledger as it was at the restore point: what was acknowledged before it is there...
            lost, details = lost_acknowledged(history, state, answered_before=target - CLOCK_SLACK_SECONDS)
            figures.check(details)
            figures.check(check_ledger(state))
            # ... and nothing recorded after it.
            late = [
                f"{e['operation_id']}: event {e['seq']} at {e['at']} is past the restore point"
                for chain in state.events.values()
                for e in chain
                if parse_ts(e["at"]).timestamp() > target + CLOCK_SLACK_SECONDS
            ]
            figures.check(late)
            first_claims = {}
            for call in history.calls:
                if call.kind == "claim" and call.operation_id not in first_claims:
                    first_claims[call.operation_id] = call
            after_target = sorted(
                op
                for op, call in first_claims.items()
                if call.wall > target + CLOCK_SLACK_SECONDS and call.outcome == "ok"
            )
            committed_after = [
                op for op in after_target if original.operations[("t1", op)]["status"] == "committed"
            ]
            acknowledged_before = sum(
                1
                for c in history.calls
                if c.outcome == "ok" and c.kind in ACKNOWLEDGED and ended_at(c) < target - CLOCK_SLACK_SECONDS
            )

            # The service, started on the restored server, serves it.
            served = Settings(
                database_url=restored.url(),
                background_sweep=False,
                rate_limit_per_second=0,
                log_level="warning",
            )
            reader = {"Authorization": f"Bearer {token('t1', 'rec-1', 'ledger:reconcile')}"}
            executor = {"Authorization": f"Bearer {token('t1', 'exec-1', 'ledger:execute')}"}
            async with Service(served) as service, service.client() as http:
                ready = await http.get("/readyz")
                before_ids = sorted(
                    {op for op, call in first_claims.items() if ended_at(call) < target - 1.0}
                )
                views = {op: (await http.get(f"/v1/operations/{op}", headers=reader)) for op in before_ids}
                unknown = {
                    op: (await http.get(f"/v1/operations/{op}", headers=reader)).status_code
                    for op in after_target
                }
                again = await http.post(
                    f"/v1/operations/{committed_after[0]}/claim",
                    headers=executor,
                    json={
                        "tool": TOOL,
                        "tool_version": TOOL_VERSION,
                        "intent": {"operation": committed_after[0]},
                    },
                )
                fresh = await http.post(
                    "/v1/operations/after-restore/claim",
                    headers=executor,
                    json={"tool": TOOL, "tool_version": TOOL_VERSION, "intent": {}},
                )
            for op, view in views.items():
                stored = state.operations[("t1", op)]
                if view.status_code != 200 or view.json()["status"] != stored["status"]:
                    figures.check(
                        [f"{op}: the restored service answers {view.status_code} {view.text[:120]}"]
                    )
                elif (
                    stored["status"] == "committed"
                    and view.json()["receipt"]["external_ref"]
                    != (original.operations[("t1", op)]["receipt"]["external_ref"])
                ):
                    figures.check([f"{op}: the restored receipt differs from the original's"])
            figures.check(
                [f"{op}: known to the restored ledger ({s})" for op, s in unknown.items() if s != 404]
            )
            figures.operations = len(history.calls)
            figures.faults = 1
            figures.extra = {
                "executed": sink.total,
                "acknowledged_before_target": acknowledged_before,
                "operations_at_target": len(state.operations),
                "operations_in_original": len(original.operations),
                "claimed_after_target": len(after_target),
                "committed_after_target": len(committed_after),
                "backup_s": round(backup_seconds, 2),
                "recovery_s": round(recovery_seconds, 2),
                "lost_before_target": sum(lost.values()),
            }
        figures.assert_clean()
        assert ready.status_code == 200 and ready.json()["checks"]["server"] == restored.address
        assert acknowledged_before > 0 and len(before_ids) > 0 and committed_after, figures.extra
        assert len(state.operations) < len(original.operations)
        # To the restored ledger an operation committed after the restore point never ran: executable again.
        assert again.status_code == 201 and again.json()["action"] == "execute", again.text
        assert fresh.status_code == 201
    finally:
        await asyncio.to_thread(restored.stop)
        await asyncio.to_thread(primary.stop)
        shutil.rmtree(root, ignore_errors=True)
