"""A real database connection whose statements are written down as they are sent: by the catalogue's
name (every statement the repositories send is one of db/queries.sql), with their arguments beside."""

from __future__ import annotations

from typing import Any

import asyncpg

from effect_ledger.db.catalogue import queries

NAMES = {statement: name for name, statement in queries().items()}


Call = tuple[str, tuple[Any, ...]]  # a statement's catalogue name and its arguments


class CountingConnection:
    """Forwards to a real connection and writes down every statement sent, by name with its arguments
    (`calls`: a list of the caller's to share between connections, or its own)."""

    def __init__(self, conn: asyncpg.Connection, calls: list[Call] | None = None) -> None:
        self._conn = conn
        self.calls: list[Call] = [] if calls is None else calls

    @property
    def sent(self) -> list[str]:
        """The names of the statements sent, in order."""
        return [name for name, _ in self.calls]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def transaction(self, **options: Any) -> Any:
        return self._conn.transaction(**options)

    async def _send(self, method: str, query: str, *args: Any) -> Any:
        self.calls.append((NAMES[query], args))
        return await getattr(self._conn, method)(query, *args)

    async def fetch(self, query: str, *args: Any) -> Any:
        return await self._send("fetch", query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return await self._send("fetchrow", query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._send("fetchval", query, *args)

    async def execute(self, query: str, *args: Any) -> Any:
        return await self._send("execute", query, *args)

    def ids_sent(self, name: str) -> list[list[str]]:
        """The operation IDs (the second argument) of every `name` statement sent, in order."""
        return [list(args[1]) for sent, args in self.calls if sent == name]
