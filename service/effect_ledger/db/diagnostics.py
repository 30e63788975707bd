"""Protected diagnostics in the database: write through the runtime role, read (audited) through the reader.

The runtime role may INSERT incidents and never SELECT them, so an incident's id is made here, in
Python, and no statement on incidents uses RETURNING. Reads run through the reader role in one
transaction with their access-log row: if the row cannot be written, nothing is read.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import tenant_tx
from effect_ledger.domain.diagnostics import (
    Incident,
    ReportKey,
    incident_values,
    incident_view,
    new_access_id,
    report_conflict,
    reported_values,
)
from effect_ledger.domain.errors import DatabaseUnavailable, not_found
from effect_ledger.settings import Settings

log = structlog.get_logger("effect_ledger.diagnostics")

SPOOL_CAPACITY = 1000  # incidents held in memory while the database is down, per process
PURGE_BATCH = 5000  # rows per purge transaction: short locks, bounded WAL per commit


async def insert_incident(conn: asyncpg.Connection, incident: Incident) -> None:
    """Insert one incident on a connection whose transaction is bound to the incident's tenant."""
    await conn.execute(sql("insert_incident"), *incident_values(incident))


async def store_incident(
    ledger: Ledger, incident: Incident, phase: str = "diagnostics", *, shed: bool = True
) -> None:
    """Store an incident in its own tenant transaction through the runtime pool.

    `shed=False` (the recorder of error incidents): never refused by load shedding and never counted
    in the pool's queue, so writing the incidents of 503 answers cannot crowd out requests.
    """
    async with tenant_tx(ledger.pool, incident.tenant, ledger.acquire_timeout, phase, shed=shed) as (conn, _):
        await insert_incident(conn, incident)


async def store_report(ledger: Ledger, incident: Incident, report: ReportKey) -> str | None:
    """Store a report that carries a report_id, in one round trip; None when this call stored it,
    else the first report's incident (409 conflicting_outcome when its fields differ)."""
    i = incident
    async with tenant_tx(ledger.pool, i.tenant, ledger.acquire_timeout, "diagnostics_report") as (conn, _):
        first = await conn.fetchrow(
            sql("store_report"),
            i.incident_id,
            i.principal,
            report.key,
            report.fingerprint,
            *reported_values(i),
        )
    if first is None:  # the first report was purged between the function's two statements
        raise DatabaseUnavailable("diagnostics_report", "ReportVanished")
    if first["stored"]:
        return None
    if not first["same_fields"]:
        raise report_conflict()
    reference: str = first["first_incident"]
    return reference


async def read_incident(
    reader: asyncpg.Pool | None,
    acquire_timeout: float,
    tenant: str,
    principal: str,
    incident_id: str,
    purpose: str,
) -> dict[str, Any]:
    """Read one incident and append its access-log row in the same transaction (reader role)."""
    if reader is None:
        raise DatabaseUnavailable("diagnostics_read", "ReaderPoolClosed")
    async with tenant_tx(reader, tenant, acquire_timeout, "diagnostics_read") as (conn, db_now):
        row = await conn.fetchrow(sql("read_incident"), tenant, incident_id)
        if row is None:
            # Another tenant's incident is invisible under RLS: the same answer as a missing one.
            raise not_found("incident")
        await conn.execute(
            sql("append_access_log"), tenant, new_access_id(), db_now, incident_id, principal, purpose
        )
    return incident_view(row)


class IncidentRecorder:
    """Stores error incidents; while the database is down it keeps them in a bounded spool and retries.

    A 503 answer names an incident that the database could not take at that moment; the spool lets
    the reference resolve once the database is back (unless this process ends first: the log line
    written when the incident was spooled is then the only record).
    """

    def __init__(self, ledger: Ledger, capacity: int = SPOOL_CAPACITY) -> None:
        self.ledger = ledger
        self.spool: deque[Incident] = deque()
        self.capacity = capacity
        self._flushing = asyncio.Lock()

    def defer(self, incident: Incident, reason: str) -> None:
        """Spool the incident without trying the database now (it is overloaded: a shed request)."""
        self._spool(incident, reason)

    async def record(self, incident: Incident) -> bool:
        """Store the incident now, or spool it; True when it reached the database."""
        if not self.spool:
            try:
                await store_incident(self.ledger, incident, "incident", shed=False)
                return True
            except Exception as exc:  # whatever failed, the reference in the answer must survive
                failure = exc.exception_type if isinstance(exc, DatabaseUnavailable) else type(exc).__name__
                self._spool(incident, failure)
                return False
        # Already spooling: the database was down a moment ago; keep order and don't pile on.
        self._spool(incident, "spool_not_empty")
        return False

    def _spool(self, incident: Incident, failure: str) -> None:
        if len(self.spool) >= self.capacity:
            dropped = self.spool.popleft()
            log.error("incident_spool_overflow", dropped_incident=dropped.incident_id, capacity=self.capacity)
        self.spool.append(incident)
        log.warning(
            "incident_spooled", incident=incident.incident_id, failure=failure, spooled=len(self.spool)
        )

    async def flush(self) -> int:
        """Write spooled incidents in order until the spool is empty or the database fails again."""
        written = 0
        async with self._flushing:
            while self.spool:
                incident = self.spool[0]
                try:
                    await store_incident(self.ledger, incident, "incident", shed=False)
                except DatabaseUnavailable:
                    break
                except asyncpg.UniqueViolationError:
                    pass  # an earlier try committed but its answer was lost: it is stored
                except Exception as exc:  # one bad row must not block the rest forever
                    log.error("incident_dropped", incident=incident.incident_id, failure=type(exc).__name__)
                else:
                    written += 1
                self.spool.popleft()
        if written:
            log.info("incident_spool_flushed", written=written, remaining=len(self.spool))
        return written

    async def run(self, interval: float) -> None:
        """Flush the spool every `interval` seconds while it holds anything (until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            if self.spool:
                await self.flush()


@dataclass(frozen=True, slots=True)
class DiagnosticsPurge:
    """How many rows a purge removed."""

    incidents: int
    access_log: int


async def _purge_batches(conn: asyncpg.Connection, query: str, cutoff: Any) -> int:
    total = 0
    while True:
        async with conn.transaction():
            # Owner, every tenant (policy `maintenance`); set per transaction so it never outlives it.
            await conn.execute(sql("maintenance_scope"), "on")
            status = await conn.execute(sql(query), cutoff, PURGE_BATCH)
        deleted = int(status.split()[-1])
        total += deleted
        if deleted < PURGE_BATCH:
            return total


async def purge_diagnostics(conn: asyncpg.Connection, settings: Settings) -> DiagnosticsPurge:
    """Delete incidents older than diagnostics_retention_days and access-log rows older than
    access_log_retention_days, in batches, on an owner connection (not in a transaction)."""
    cutoffs = await conn.fetchrow(
        sql("purge_cutoffs"), settings.diagnostics_retention_days, settings.access_log_retention_days
    )
    incidents = await _purge_batches(conn, "purge_incidents_batch", cutoffs["incidents_before"])
    access_log = await _purge_batches(conn, "purge_access_log_batch", cutoffs["access_log_before"])
    log.info("diagnostics_purged", incidents=incidents, access_log=access_log)
    return DiagnosticsPurge(incidents, access_log)
