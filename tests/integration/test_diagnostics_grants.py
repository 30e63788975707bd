"""The diagnostics split at the database: each role (runtime, reader, owner) can do exactly its part."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from effect_ledger.db.catalogue import sql
from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE, derived_password

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage

TABLES = ("ledger.operations", "ledger.events", "diagnostics.incidents", "diagnostics.access_log")
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
INSERT_INCIDENT = (
    "INSERT INTO diagnostics.incidents (tenant_id, incident_id, source, phase, cause)"
    " VALUES ($1, $2, 'report', 'request', 'timeout')"
)
INSERT_ACCESS = (
    "INSERT INTO diagnostics.access_log (tenant_id, access_id, incident_id, principal, purpose)"
    " VALUES ($1, $2, $3, 'auditor', 'grant test')"
)
INC_T1 = "inc_" + "a" * 24
INC_T2 = "inc_" + "b" * 24


async def connect_as(url: str, role: str) -> asyncpg.Connection:
    """A direct connection as a service role, with the password `migrate` derived for it."""
    return await asyncpg.connect(url, user=role, password=derived_password(url, role))


@pytest.fixture
async def owner(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(db_url)
    try:
        yield conn
    finally:
        await conn.close()


class Bound:
    """A role's connection that runs each statement in its own transaction bound to `tenant` (when set),
    as the service does: a session-level setting would not reach a Citus worker's shards."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.tenant: str | None = None

    async def _run(self, method: str, query: str, *args: Any) -> Any:
        async with self.conn.transaction():
            if self.tenant is not None:
                await self.conn.fetchrow(sql("tenant_context"), self.tenant)
            return await getattr(self.conn, method)(query, *args)

    async def execute(self, query: str, *args: Any) -> Any:
        return await self._run("execute", query, *args)

    async def fetch(self, query: str, *args: Any) -> Any:
        return await self._run("fetch", query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._run("fetchval", query, *args)


@pytest.fixture
async def runtime(db_url: str) -> AsyncIterator[Bound]:
    conn = await connect_as(db_url, RUNTIME_ROLE)
    try:
        yield Bound(conn)
    finally:
        await conn.close()


@pytest.fixture
async def reader(db_url: str) -> AsyncIterator[Bound]:
    conn = await connect_as(db_url, READER_ROLE)
    try:
        yield Bound(conn)
    finally:
        await conn.close()


def set_tenant(conn: Bound, tenant: str) -> None:
    conn.tenant = tenant


async def denied(call: Callable[[], Awaitable[Any]]) -> str:
    """Run a statement that must be refused with `permission denied`; the message, for inspection."""
    with pytest.raises(asyncpg.InsufficientPrivilegeError) as refused:
        await call()
    return str(refused.value)


async def seed(owner: asyncpg.Connection) -> None:
    """One incident in t1 and one in t2 (the owner is a superuser here, so RLS does not bind it)."""
    await owner.execute(INSERT_INCIDENT, "t1", INC_T1)
    await owner.execute(INSERT_INCIDENT, "t2", INC_T2)


async def test_privilege_matrix_is_exactly_the_contract(owner: asyncpg.Connection) -> None:
    granted: dict[str, set[tuple[str, str]]] = {RUNTIME_ROLE: set(), READER_ROLE: set()}
    for role in granted:
        for table in TABLES:
            for privilege in PRIVILEGES:
                # has_any_column_privilege also catches a column-level grant of SELECT/INSERT/UPDATE.
                check = (
                    "has_any_column_privilege"
                    if privilege in ("SELECT", "INSERT", "UPDATE")
                    else "has_table_privilege"
                )
                if await owner.fetchval(f"SELECT {check}($1, $2, $3)", role, table, privilege):
                    granted[role].add((table, privilege))
    # The runtime role's ledger grants belong to the ledger's tests; here, its diagnostics grants.
    runtime_diagnostics = {g for g in granted[RUNTIME_ROLE] if g[0].startswith("diagnostics.")}
    assert runtime_diagnostics == {("diagnostics.incidents", "INSERT"), ("diagnostics.access_log", "SELECT")}
    assert granted[READER_ROLE] == {("diagnostics.incidents", "SELECT"), ("diagnostics.access_log", "INSERT")}
    assert not await owner.fetchval("SELECT has_schema_privilege($1, 'ledger', 'USAGE')", READER_ROLE)
    roles = await owner.fetch(
        "SELECT rolname, rolsuper, rolbypassrls, rolcreatedb, rolcreaterole FROM pg_roles"
        " WHERE rolname = ANY($1)",
        [RUNTIME_ROLE, READER_ROLE],
    )
    assert len(roles) == 2
    powers = ("rolsuper", "rolbypassrls", "rolcreatedb", "rolcreaterole")
    assert [[r[k] for k in powers] for r in roles] == [[False] * 4] * 2
    forced = await owner.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = 'diagnostics'::regnamespace AND relkind = 'r'"
        " AND relrowsecurity AND relforcerowsecurity ORDER BY relname"
    )
    assert [r["relname"] for r in forced] == ["access_log", "incidents"]


async def test_runtime_writes_incidents_but_cannot_read_them(
    runtime: Bound, owner: asyncpg.Connection
) -> None:
    set_tenant(runtime, "t1")
    assert await runtime.execute(INSERT_INCIDENT, "t1", INC_T1) == "INSERT 0 1"
    message = await denied(lambda: runtime.fetch("SELECT * FROM diagnostics.incidents"))
    assert "permission denied" in message
    # RETURNING reads the new row back, which is a SELECT: refused too.
    returning = INSERT_INCIDENT + " RETURNING incident_id"
    await denied(lambda: runtime.fetchval(returning, "t1", "inc_" + "c" * 24))
    await denied(lambda: runtime.execute("UPDATE diagnostics.incidents SET cause = 'auth'"))
    await denied(lambda: runtime.execute("DELETE FROM diagnostics.incidents"))
    await denied(lambda: runtime.execute("TRUNCATE diagnostics.incidents"))
    await denied(lambda: runtime.execute(INSERT_ACCESS, "t1", "acc_1", INC_T1))
    # Row-level security: a row for another tenant than the transaction's is refused.
    message = await denied(lambda: runtime.execute(INSERT_INCIDENT, "t2", INC_T2))
    assert "row-level security" in message
    assert await owner.fetchval("SELECT count(*) FROM diagnostics.incidents") == 1
    # The auditors' list of reads goes through the runtime role.
    assert await runtime.fetch("SELECT * FROM diagnostics.access_log") == []


async def test_reader_reads_incidents_and_appends_access_log_only(
    reader: Bound, owner: asyncpg.Connection
) -> None:
    await seed(owner)
    # No tenant set: the policy matches nothing, so nothing is visible.
    assert await reader.fetchval("SELECT count(*) FROM diagnostics.incidents") == 0
    set_tenant(reader, "t1")
    assert [r["incident_id"] for r in await reader.fetch("SELECT * FROM diagnostics.incidents")] == [INC_T1]
    assert await reader.execute(INSERT_ACCESS, "t1", "acc_1", INC_T1) == "INSERT 0 1"
    await denied(lambda: reader.execute(INSERT_ACCESS, "t2", "acc_2", INC_T2))  # RLS WITH CHECK
    await denied(lambda: reader.fetch("SELECT * FROM diagnostics.access_log"))
    await denied(lambda: reader.execute("UPDATE diagnostics.access_log SET purpose = 'x'"))
    await denied(lambda: reader.execute("DELETE FROM diagnostics.access_log"))
    await denied(lambda: reader.execute(INSERT_INCIDENT, "t1", "inc_" + "d" * 24))
    await denied(lambda: reader.execute("UPDATE diagnostics.incidents SET cause = 'auth'"))
    await denied(lambda: reader.execute("DELETE FROM diagnostics.incidents"))
    for table in ("ledger.operations", "ledger.events"):
        await denied(lambda t=table: reader.fetch(f"SELECT * FROM {t}"))
        await denied(lambda t=table: reader.execute(f"UPDATE {t} SET tenant_id = tenant_id"))
        await denied(lambda t=table: reader.execute(f"DELETE FROM {t}"))
    set_tenant(reader, "t2")
    assert [r["incident_id"] for r in await reader.fetch("SELECT * FROM diagnostics.incidents")] == [INC_T2]
    set_tenant(reader, "")
    assert await reader.fetchval("SELECT count(*) FROM diagnostics.incidents") == 0
    assert await owner.fetchval("SELECT count(*) FROM diagnostics.access_log") == 1


async def test_owner_sees_every_tenant_and_may_delete(owner: asyncpg.Connection) -> None:
    await seed(owner)
    assert await owner.fetchval("SELECT count(*) FROM diagnostics.incidents") == 2
    # The owner purges expired diagnostics: it holds DELETE, which neither service role has.
    assert await owner.fetchval("SELECT has_table_privilege(current_user, 'diagnostics.incidents', 'DELETE')")
    assert await owner.execute("DELETE FROM diagnostics.incidents WHERE tenant_id = 't2'") == "DELETE 1"
