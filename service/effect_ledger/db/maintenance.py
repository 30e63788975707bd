"""Sweep and purge: the ledger's maintenance, run as the owner, by one replica at a time.

Both connect with the owner URL (EFFECT_LEDGER_DATABASE_URL), never the runtime role: they work
across tenants, and forced row-level security binds every role but a superuser. Migration 0002 adds
the permissive policy `maintenance`, which lets only the owner login see every tenant's rows, and
only in a transaction that sets effect_ledger.maintenance = 'on'; no SECURITY DEFINER function and
no BYPASSRLS role is needed, so this works on managed PostgreSQL too. The sweeper uses that scope
only to find and lock candidates, then writes each operation under its own tenant, exactly as a
request would. Each run holds a session advisory lock (pg_try_advisory_lock): a second sweeper or
purger, on any replica or CronJob, finds it taken and skips its run instead of queueing behind it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import structlog

from effect_ledger.db import approvals, failover
from effect_ledger.db.catalogue import sql
from effect_ledger.db.diagnostics import purge_diagnostics
from effect_ledger.db.journal import purge_idle_sessions
from effect_ledger.db.journal_state import purge_expired_payloads
from effect_ledger.db.ledger import UNOBSERVED, LedgerObserver, returned_events
from effect_ledger.db.pools import server_settings, set_json_codecs
from effect_ledger.db.urls import writable_url
from effect_ledger.domain.model import UNKNOWN, EventDraft, receipt_digest
from effect_ledger.settings import Settings

log = structlog.get_logger("effect_ledger.maintenance")

# pg_try_advisory_lock(int4, int4) keys: a class for effect-ledger ("ELMT") and one per task.
LOCK_CLASS = 0x454C4D54
SWEEP_LOCK = (LOCK_CLASS, 1)
PURGE_LOCK = (LOCK_CLASS, 2)
CONNECT_TIMEOUT_SECONDS = 10


@dataclass
class RunResult:
    """What one sweep or purge run did; `skipped` when another run held the advisory lock."""

    task: str
    skipped: bool = False
    batches: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The result as one JSON-ready line (the CLI prints it, the background loop logs it)."""
        return {"task": self.task, "skipped": self.skipped, "batches": self.batches, **self.counts}


async def owner_connection(settings: Settings) -> asyncpg.Connection:
    """One owner connection with the service's timeouts and JSON codecs, on the writable primary.

    Every run opens its own, through the URL's host list: after a failover the next run finds the new
    primary by itself (a run cut by the switch fails, is logged, and the next interval runs again)."""
    if not settings.database_url:
        raise ValueError("sweep and purge need the owner URL (EFFECT_LEDGER_DATABASE_URL)")
    conn = await asyncpg.connect(
        writable_url(settings.database_url),
        timeout=CONNECT_TIMEOUT_SECONDS,
        server_settings=server_settings(settings, "effect-ledger-maintenance"),
    )
    failover.keep_alive(conn)
    await set_json_codecs(conn)  # binary: run_sweep answers the row as one composite
    return conn


class OwnerLink:
    """One owner connection kept by a loop of `serve` (the receipts log's integrator, checkpointer or
    guard): opened at first use, and opened again after a pass failed. A pass cut by a failover
    fails, is logged, and the next finds the new primary through the URL's host list; start-up never
    fails on it (serve stops when one of its first workers fails to start, and granian alike). Until
    round 20 these loops held the connection they opened at start-up: after a failover they failed
    every pass on the dead one, and the log stopped growing until a restart."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: asyncpg.Connection | None = None

    async def get(self) -> asyncpg.Connection:
        """The open connection, or a new one when there is none or it was closed under us."""
        if self._conn is None or self._conn.is_closed():
            self._conn = await owner_connection(self._settings)
        return self._conn

    def drop(self) -> None:
        """After a failed pass: close the connection (its session state, held locks and all); the next
        `get` opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()


@asynccontextmanager
async def exclusive(conn: asyncpg.Connection, key: tuple[int, int]) -> AsyncIterator[bool]:
    """Hold the advisory lock `key` for the block; yields False (and holds nothing) when it is taken."""
    held = bool(await conn.fetchval(sql("try_maintenance_lock"), *key))
    try:
        yield held
    finally:
        if held and not conn.is_closed():
            await conn.fetchval(sql("release_maintenance_lock"), *key)


async def sweep_batch(
    conn: asyncpg.Connection, batch_size: int, observer: LedgerObserver = UNOBSERVED
) -> tuple[int, int]:
    """Lock up to batch_size expired submitted operations and mark each unknown; (found, swept)."""
    swept = 0
    recorded: list[EventDraft] = []
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        keys = await conn.fetch(sql("sweep_candidates"), batch_size)
        await conn.fetchval(sql("maintenance_scope"), "off")
        for tenant, operation_id in keys:
            # Each write runs under the row's own tenant, as a request would (RLS WITH CHECK applies).
            # Locked by its tenant (one shard) first, and skipped if a request holds it: never waited for.
            await conn.fetchrow(sql("tenant_context"), tenant)
            if await conn.fetchrow(sql("lock_operation_unless_held"), tenant, operation_id) is None:
                continue
            # ledger.sweep binds the tenant too, reads the locked row's chain head and clock, and applies
            # the expiry rule that complete and resolve apply (alembic/functions/60_sweep.sql).
            row = await conn.fetchrow(sql("run_sweep"), tenant, operation_id)
            events = returned_events(row)
            swept += row["outcome"] == "expired"
            recorded.extend(events)
    if recorded:  # committed: the metrics count them as sweeps
        observer.observe("sweep", UNKNOWN, recorded)
    return len(keys), swept


async def _sweep_on(conn: asyncpg.Connection, batch_size: int, observer: LedgerObserver) -> RunResult:
    result = RunResult("sweep", counts={"swept": 0})
    async with exclusive(conn, SWEEP_LOCK) as held:
        if not held:
            result.skipped = True
            return result
        while True:
            found, swept = await sweep_batch(conn, batch_size, observer)
            result.batches += 1
            result.counts["swept"] += swept
            # A short batch means nothing sweepable is left; a batch that swept nothing holds only rows
            # that requests hold right now (skipped): leave them to the next run rather than spin.
            if found < batch_size or swept == 0:
                break
        # Approvals (section 15): expiry by the database clock is recorded as an event, here too.
        expired = await approvals.expire_due(conn, batch_size)
        result.counts["approvals_expired"] = expired
        if isinstance(observer, approvals.ApprovalObserver):  # the metrics, when serve runs the sweep
            for _ in range(expired):
                observer.approval_event("expired")
    return result


async def sweep(settings: Settings, observer: LedgerObserver = UNOBSERVED) -> RunResult:
    """Mark every submitted operation whose lease has expired unknown, with a `lease_expired` event."""
    conn = await owner_connection(settings)
    try:
        return await _sweep_on(conn, settings.sweep_batch_size, observer)
    finally:
        await conn.close()


async def purge_ledger_batch(
    conn: asyncpg.Connection, retention_days: int, batch_size: int
) -> tuple[int, int]:
    """Turn one batch of old terminal operations into tombstones and delete their events;
    (operations, events). The row stays, so the ID keeps answering as its final status says."""
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        await conn.fetchval(sql("purge_mode"))  # SET LOCAL effect_ledger.purge: the events trigger's gate
        keys = await conn.fetch(sql("purge_candidates"), retention_days, batch_size)
        by_tenant: dict[str, list[str]] = {}
        for tenant, operation_id in keys:
            by_tenant.setdefault(tenant, []).append(operation_id)
        operations = events = 0
        for tenant, candidates in by_tenant.items():  # one shard (group) at a time on Citus
            rows = await conn.fetch(sql("lock_purgeable"), tenant, candidates, retention_days)
            if not rows:
                continue
            locked = [r["operation_id"] for r in rows]
            digests = [receipt_digest(r["receipt"]) for r in rows]
            events += _deleted(await conn.execute(sql("purge_events"), tenant, locked))
            operations += _deleted(await conn.execute(sql("tombstone_operations"), tenant, locked, digests))
    return operations, events


async def expire_tombstones_batch(conn: asyncpg.Connection, tombstone_days: int, batch_size: int) -> int:
    """Delete one batch of tombstones older than tombstone_days (with any event appended to them
    since); only now does the ID vanish."""
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        await conn.fetchval(sql("purge_mode"))
        keys = await conn.fetch(sql("tombstone_candidates"), tombstone_days, batch_size)
        by_tenant: dict[str, list[str]] = {}
        for tenant, operation_id in keys:
            by_tenant.setdefault(tenant, []).append(operation_id)
        expired = 0
        for tenant, candidates in by_tenant.items():  # one shard (group) at a time on Citus
            rows = await conn.fetch(sql("lock_expired_tombstones"), tenant, candidates, tombstone_days)
            locked = [r["operation_id"] for r in rows]
            if locked:
                await conn.execute(sql("purge_events"), tenant, locked)
                expired += _deleted(await conn.execute(sql("purge_operations"), tenant, locked))
        return expired


def _deleted(status: str) -> int:
    """The row count of a `DELETE n` (or `UPDATE n`) command status."""
    return int(status.split()[-1])


async def _purge_on(conn: asyncpg.Connection, settings: Settings) -> RunResult:
    result = RunResult("purge", counts={"operations": 0, "events": 0})
    async with exclusive(conn, PURGE_LOCK) as held:
        if not held:
            result.skipped = True
            return result
        while True:
            operations, events = await purge_ledger_batch(
                conn, settings.retention_days, settings.purge_batch_size
            )
            result.batches += 1
            result.counts["operations"] += operations
            result.counts["events"] += events
            if operations < settings.purge_batch_size:
                break
        result.counts["tombstones_expired"] = 0
        while True:
            expired = await expire_tombstones_batch(conn, settings.tombstone_days, settings.purge_batch_size)
            result.counts["tombstones_expired"] += expired
            if expired < settings.purge_batch_size:
                break
        # Diagnostics retention (issue 4): same owner connection, same advisory lock; each batch
        # sets maintenance_scope('on') in its own transaction.
        purged = await purge_diagnostics(conn, settings)
        result.counts.update(incidents=purged.incidents, access_log=purged.access_log)
        # Journal retention (issue 12): sessions idle for journal_retention_days, records with them.
        result.counts["journal_sessions"] = await purge_idle_sessions(
            conn, settings.journal_retention_days, settings.purge_batch_size
        )
        # Continuation payloads (section 12) go when they expire; their records' metadata stays.
        result.counts["continuation_payloads"] = await purge_expired_payloads(conn)
        # Approvals (section 15): the intents kept for approvers go once they are no use.
        result.counts["approval_intents"] = await approvals.purge_intents(conn)
    return result


async def purge(settings: Settings) -> RunResult:
    """Tombstone terminal operations untouched for retention_days (their events and receipt bodies
    go), and delete tombstones untouched for tombstone_days; never any other operation; then
    expired diagnostics, and journal sessions unchanged for journal_retention_days (with their records)."""
    conn = await owner_connection(settings)
    try:
        return await _purge_on(conn, settings)
    finally:
        await conn.close()


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits across all tenants: unknown outcomes to reconcile, and operations purge is late on."""

    unknown_waiting: int
    unknown_oldest_seconds: float
    purge_overdue_seconds: float


async def read_backlog(settings: Settings) -> Backlog:
    """Count the unknown outcomes and the purge lag, across tenants (owner, maintenance scope)."""
    conn = await owner_connection(settings)
    try:
        async with conn.transaction(readonly=True):
            await conn.fetchval(sql("maintenance_scope"), "on")
            unknown = await conn.fetchrow(sql("unknown_backlog"))
            overdue = await conn.fetchval(sql("purge_backlog"), settings.retention_days)
    finally:
        await conn.close()
    return Backlog(int(unknown["waiting"]), float(unknown["oldest_seconds"]), float(overdue))


@asynccontextmanager
async def in_background(*loops: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run each coroutine as a task while the context is open; on leaving, cancel them and wait."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@asynccontextmanager
async def watch_backlog(settings: Settings, report: Callable[[Backlog], None]) -> AsyncIterator[None]:
    """In `serve`: read the backlog every `backlog_interval_seconds` and hand it to `report` (metrics).

    Runs whether or not sweep and purge run in this process (CronJobs may run them): the gauges say
    how far behind they are, which is what an alert needs.
    """
    if settings.backlog_interval_seconds <= 0 or not settings.database_url:
        yield
        return

    async def probe() -> None:
        while True:
            try:
                report(await read_backlog(settings))
            except Exception as exc:  # a database blip: the next interval tries again
                log.warning("backlog_failed", exception_type=type(exc).__name__)
            await asyncio.sleep(settings.backlog_interval_seconds)

    async with in_background(probe()):
        yield


Task = Callable[[Settings], Awaitable[RunResult]]


async def _every(interval: float, run: Task, settings: Settings) -> None:
    """Run a maintenance task now and then every `interval` seconds until cancelled."""
    while True:
        try:
            result = await run(settings)
            if any(result.counts.values()):
                log.info("maintenance_run", **result.summary())
        except Exception as exc:
            # The next interval retries; a failed run (a database blip, say) must not end the loop.
            log.warning("maintenance_failed", task=run.__name__, exception_type=type(exc).__name__)
        await asyncio.sleep(interval)


@asynccontextmanager
async def background_maintenance(
    settings: Settings, observer: LedgerObserver = UNOBSERVED
) -> AsyncIterator[None]:
    """Sweep (and purge, less often) in the background of `serve` when background_sweep is on."""
    if not settings.background_sweep:
        yield
        return
    if not settings.database_url:
        log.warning("maintenance_disabled", reason="background sweep needs EFFECT_LEDGER_DATABASE_URL")
        yield
        return
    observed_sweep = functools.update_wrapper(functools.partial(sweep, observer=observer), sweep)
    async with in_background(
        _every(settings.sweep_interval_seconds, observed_sweep, settings),
        _every(settings.purge_interval_seconds, purge, settings),
    ):
        yield
