"""The readiness check's database half."""

from __future__ import annotations

from typing import Any

from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import UNAVAILABLE


async def database_ready(ledger: Ledger, expected_head: str) -> tuple[bool, dict[str, Any]]:
    """(ready, checks): the pool hands out a connection and alembic_version is at head."""
    try:
        async with ledger.pool.acquire(timeout=ledger.acquire_timeout) as conn:
            head = await conn.fetchval(sql("migration_head"))
    except UNAVAILABLE as exc:
        return False, {"database": "unreachable", "error": type(exc).__name__}
    at_head = head == expected_head
    return at_head, {"database": "ok", "migrations": "at_head" if at_head else "behind"}
