"""repeat --statements: pg_stat_statements of the bench's database, reset before a window and read after
it, per cycle, on a real server that preloads the library (Debian's PostgreSQL 15), and a clear refusal
on one that cannot count (the embedded build has no such module)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest

from effect_ledger_bench.statements import Statements, StatementsUnavailable, report
from support.replication import Node, give, run


def counting_binaries() -> Path | None:
    """A PostgreSQL bin directory whose installation has pg_stat_statements (Debian's contrib)."""
    for bindir in sorted(Path("/usr/lib/postgresql").glob("*/bin")):
        version = bindir.parent.name
        control = Path("/usr/share/postgresql") / version / "extension" / "pg_stat_statements.control"
        if (bindir.parent / "lib" / "pg_stat_statements.so").exists() and control.exists():
            return bindir
    return None


@asynccontextmanager
async def debian_server(monkeypatch: pytest.MonkeyPatch, preload: bool) -> AsyncIterator[str]:
    """A server of its own from the PostgreSQL that has pg_stat_statements installed, preloading it
    (track = all) or not; its owner's URL."""
    bindir = counting_binaries()
    if bindir is None:
        pytest.skip("no PostgreSQL with pg_stat_statements here (Debian's postgresql-15 has it)")
    monkeypatch.setenv("EFFECT_LEDGER_PG_BIN", str(bindir))
    root = Path(tempfile.mkdtemp(prefix="el-statements-"))
    give(root)
    node = Node(root, "counting")
    try:
        run("initdb", "-D", str(node.data), "-U", "postgres", "-E", "UTF8", "--no-sync", "--auth=trust")
        node.configure(listen_addresses="127.0.0.1", unix_socket_directories=str(root), fsync="off")
        if preload:
            node.configure(shared_preload_libraries="pg_stat_statements")
            node.configure(**{"pg_stat_statements.track": "all"})
        node.start()
        yield f"postgresql://postgres@127.0.0.1:{node.port}/postgres"
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def counting_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A server that preloads pg_stat_statements."""
    async with debian_server(monkeypatch, preload=True) as url:
        yield url


async def test_a_window_counts_each_statement_per_cycle_and_none_of_its_own(counting_server: str) -> None:
    counter = Statements(counting_server)
    await counter.enable()
    conn = await asyncpg.connect(counting_server)
    try:
        await conn.fetchval("SELECT $1::int", 0)  # before the reset: not counted
        await conn.execute(
            "CREATE FUNCTION doubled(n int) RETURNS int LANGUAGE plpgsql AS"
            " $$ BEGIN RETURN (SELECT n * 2); END $$"
        )
        await counter.reset()
        for n in range(6):
            assert await conn.fetchval("SELECT $1::int", n) == n
        for n in range(3):
            assert await conn.fetchval("SELECT doubled($1)", n) == 2 * n
    finally:
        await conn.close()
    entries = await counter.read(cycles=3)
    top = {e.query: e for e in entries if e.toplevel}
    nested = [e for e in entries if not e.toplevel]
    # the bench's own reset and read are not listed; per cycle: 6 and 3 calls over 3 cycles
    assert set(top) == {"SELECT $1::int", "SELECT doubled($1)"}, entries
    assert (top["SELECT $1::int"].calls, top["SELECT $1::int"].rows) == (2.0, 2.0)
    assert (top["SELECT doubled($1)"].calls, top["SELECT doubled($1)"].rows) == (1.0, 1.0)
    assert [(e.calls, e.rows) for e in nested] == [(1.0, 1.0)], entries  # the function's SELECT
    assert all(e.exec_us > 0 for e in entries)
    lines = report(entries)
    total = top["SELECT $1::int"].exec_us + top["SELECT doubled($1)"].exec_us  # nested time is inside
    assert lines[0].startswith(f"  statements per cycle (pg_stat_statements): top-level {total:.1f} us")
    assert sum("SELECT doubled($1)" in line for line in lines[1:]) == 1
    assert lines[1:] == [f"    {e.line()}" for e in entries if e.exec_us >= 0.01 * total]


async def test_a_server_without_the_module_is_refused_with_what_to_do(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        preloaded = await conn.fetchval("SHOW shared_preload_libraries")
    finally:
        await conn.close()
    if "pg_stat_statements" in preloaded:
        pytest.skip("this run's server preloads pg_stat_statements (the embedded build has no such module)")
    with pytest.raises(StatementsUnavailable, match="shared_preload_libraries = 'pg_stat_statements'"):
        await Statements(empty_db).enable()


async def test_a_server_that_has_the_module_but_does_not_preload_it_is_refused_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with debian_server(monkeypatch, preload=False) as url:
        with pytest.raises(StatementsUnavailable, match="shared_preload_libraries = 'pg_stat_statements'"):
            await Statements(url).enable()
