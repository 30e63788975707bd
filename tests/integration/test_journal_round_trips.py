"""Round trips of the journal's repository calls, counted on a real connection (STYLE.md: the write path)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from effect_ledger.db import journal as repo
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import create_role_pool
from effect_ledger.db.urls import RUNTIME_ROLE
from effect_ledger.domain.errors import LedgerError
from effect_ledger.domain.journal_history import AppendCommand, Caps
from effect_ledger.settings import Settings
from support.counting import Call, CountingConnection

SID = "ses_" + "R" * 24


class CountingPool:
    def __init__(self, pool: asyncpg.Pool, sent: list[Call]) -> None:
        self._pool, self._sent = pool, sent

    def acquire(self, timeout: float | None = None) -> Any:
        return self._counted(timeout)

    @asynccontextmanager
    async def _counted(self, seconds: float | None) -> AsyncIterator[CountingConnection]:
        async with self._pool.acquire(timeout=seconds) as conn:
            yield CountingConnection(conn, self._sent)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text, "schema": 1}


async def test_each_call_sends_the_statements_its_docstring_counts(db_url: str) -> None:
    pool = await create_role_pool(Settings(database_url=db_url), RUNTIME_ROLE, 2)
    sent: list[Call] = []
    ledger = Ledger(CountingPool(pool, sent), 2.0)  # type: ignore[arg-type]

    async def calls(run: Any) -> list[str]:
        sent.clear()
        await run
        return [name for name, _ in sent]

    try:
        assert await calls(repo.create_session(ledger, "t1", "p", SID, {})) == [
            "tenant_context",
            "journal_create_session",
        ]
        append = repo.append(ledger, "t1", "p", SID, AppendCommand(0, [user("a")]), Caps())
        assert await calls(append) == ["tenant_context", "journal_lock_session", "journal_append"]
        refused = repo.append(ledger, "t1", "p", SID, AppendCommand(0, [user("b")]), Caps())
        assert await calls(refused) == ["tenant_context", "journal_lock_session"]
        assert await calls(repo.read_session(ledger, "t1", SID, "p")) == [
            "tenant_context",
            "journal_read_session",
            "journal_read_records",
        ]
        assert await calls(repo.read_with_effects(ledger, "t1", SID, None)) == [
            "tenant_context",
            "journal_read_session",
            "journal_read_records",
        ]  # no call names an operation
        await repo.append(
            ledger,
            "t1",
            "p",
            SID,
            AppendCommand(
                1,
                [
                    {
                        "type": "tool_call",
                        "call_id": "c",
                        "name": "m",
                        "arguments": {},
                        "operation_id": "op-1",
                        "schema": 1,
                    }
                ],
            ),
            Caps(),
        )
        assert await calls(repo.read_with_effects(ledger, "t1", SID, None)) == [
            "tenant_context",
            "journal_read_session",
            "journal_read_records",
            "journal_effects",
        ]
        assert await calls(repo.delete_session(ledger, "t1", "p", SID)) == [
            "tenant_context",
            "journal_delete_session",
        ]
        with pytest.raises(LedgerError) as gone:
            await repo.delete_session(ledger, "t1", "p", SID)
        assert gone.value.code == "not_found"
    finally:
        await pool.close()
