"""The readiness check's database half: reachable, writable, at the migration head; and the switch.

A server that answers but is a standby or read-only is not ready (the service needs the primary):
the pools' connections are expired so that the next ones look for the writable host again. The
watch of the pools (db/failover.py) adds which server serves, how often it changed (a failover or a
switchover), and since when the primary has been lost while an outage lasts.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from effect_ledger.db import failover
from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import UNAVAILABLE


async def database_ready(
    ledger: Ledger, expected_head: str, watcher: failover.ServerWatch | None = None
) -> tuple[bool, dict[str, Any]]:
    """(ready, checks): a writable server hands out a connection and alembic_version is at head."""
    switch = watcher.report if watcher is not None else dict
    try:
        async with ledger.pool.acquire(timeout=ledger.acquire_timeout) as conn:
            head = await conn.fetchval(sql("migration_head"))
            identity = failover.identity_of(await conn.fetchrow(sql("server_identity")))
    except UNAVAILABLE as exc:
        await failover.server_lost(ledger.pool, exc)
        return False, {"database": "unreachable", "error": type(exc).__name__, **switch()}
    if not identity.writable:
        if watcher is not None:
            await watcher.server_lost(ReadOnlyServer())
        return False, {"database": "read_only", **switch(), "server": identity.address}
    if watcher is not None:
        watcher.observe(identity)
    at_head = head == expected_head
    checks = {"database": "ok", "migrations": "at_head" if at_head else "behind", **switch()}
    return at_head, checks


class ReadOnlyServer(asyncpg.exceptions.ReadOnlySQLTransactionError):  # type: ignore[misc]
    """Readiness reached a standby or a read-only server (reported to the watch: expire the pools)."""

    def __init__(self) -> None:
        super().__init__("the server is a standby or read-only")
