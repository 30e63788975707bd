"""db/batching.WriteBatcher without a database: the acquire timeout of queued calls, cancellation
before and after a call is sent, the stall release, and the admission's bookkeeping afterwards.

The pool is a stand-in whose statements wait for a gate the test opens; the batcher's own rules are
what is checked (the statements themselves are covered by tests/integration/test_write_batching.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from effect_ledger.db import batching
from effect_ledger.db.batching import WriteBatcher
from effect_ledger.db.catalogue import sql
from effect_ledger.db.pools import Admission


class Conn:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._holder = self  # asyncpg's PoolConnectionProxy: its holder's generation against its pool's
        self._pool = pool
        self._generation = pool._generation
        self.closed: bool | str = False

    def is_closed(self) -> bool:
        if self.closed == "detached":  # asyncpg's proxy once the pool took its closed connection back
            raise asyncpg.InterfaceError("connection has been released back to the pool")
        return bool(self.closed)

    async def fetchrow(self, query: str, *args: Any) -> dict[str, Any]:
        await self.pool.gate.wait()
        self.pool.written.append(args[1])
        return {"operation_id": args[1]}

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        """A batch statement: its lock_timeout (after its tenant, for a per-tenant batch), then its
        commands, each its place in the batch, then its parameters (tenant, ID, ...)."""
        *before, lock_timeout, commands = args
        await self.pool.gate.wait()
        self.pool.batches.append((query, *before, lock_timeout, [command[2] for command in commands]))
        self.pool.written.extend(command[2] for command in commands)
        return [{"i": command[0], "operation_id": command[2]} for command in commands]


class Pool:
    """Connections whose statements wait until `gate` is set; what they wrote, in order."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written: list[str] = []
        self.batches: list[
            tuple[Any, ...]
        ] = []  # each batch statement: its text, its tenant if any, its lock_timeout, its IDs
        self._generation = 0  # asyncpg's: Pool.expire_connections bumps it
        self.acquired: list[Conn] = []
        self.released: list[Conn] = []

    @asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[Conn]:  # noqa: ASYNC109 - asyncpg.Pool.acquire's own signature
        conn = Conn(self)
        self.acquired.append(conn)
        try:
            yield conn
        finally:
            self.released.append(conn)


def batcher(pool: Pool, acquire_timeout: float = 5.0) -> tuple[WriteBatcher, Admission]:
    admission = Admission("runtime", 10, 100, 60.0)
    return WriteBatcher(pool, acquire_timeout, 1, 32, admission), admission  # type: ignore[arg-type]


def call(b: WriteBatcher, op: str, query: str = "run_heartbeat", tenant: str = "t1") -> asyncio.Task[Any]:
    return asyncio.ensure_future(b.run(query, (tenant, op, b"hash", 30)))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def assert_clean(b: WriteBatcher, admission: Admission) -> None:
    assert not b._waiting and b._inflight == 0
    assert admission.queued == 0 and admission._inflight == {}


async def test_queued_calls_time_out_each_at_its_own_deadline_in_arrival_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batching, "STALL_SECONDS", 60.0)  # the held statement keeps its place
    pool = Pool()
    b, admission = batcher(pool, acquire_timeout=0.6)  # 0.2 s of margin for a loaded machine's wake-ups
    held = call(b, "held")  # in flight until the gate opens: the others queue
    await settle()
    first = call(b, "first")
    await asyncio.sleep(0.3)
    second = call(b, "second")
    await settle()
    assert len(b._waiting) == 2
    await asyncio.sleep(0.4)  # first's deadline (0.6 s) has passed, second's (0.9 s) not yet
    assert first.done() and not second.done()
    with pytest.raises(TimeoutError):
        first.result()
    assert [c.args[1] for c in b._waiting] == ["second"]
    with pytest.raises(TimeoutError):
        await second
    assert not b._waiting
    pool.gate.set()
    assert await held == {"operation_id": "held"}
    assert pool.written == ["held"]  # the timed-out calls never reached the database
    assert_clean(b, admission)


async def test_a_call_sent_before_its_deadline_waits_for_its_answer_however_long() -> None:
    pool = Pool()
    b, admission = batcher(pool, acquire_timeout=0.05)
    sent = call(b, "sent")
    await asyncio.sleep(0.15)  # three acquire timeouts: the call was sent, so it is not timed out
    assert not sent.done()
    pool.gate.set()
    assert await sent == {"operation_id": "sent"}
    assert_clean(b, admission)


async def test_a_cancelled_queued_call_leaves_the_queue_and_writes_nothing() -> None:
    pool = Pool()
    b, admission = batcher(pool)
    held = call(b, "held")
    await settle()
    queued = call(b, "queued")
    await settle()
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert not b._waiting
    pool.gate.set()
    await held
    assert pool.written == ["held"]
    assert_clean(b, admission)


async def test_a_cancelled_sent_call_waits_for_its_statement_to_end_then_is_cancelled() -> None:
    pool = Pool()
    b, admission = batcher(pool)
    sent = call(b, "sent")
    await settle()
    sent.cancel()
    await asyncio.sleep(0.05)
    assert not sent.done()  # the write runs to its end (pools._to_the_end): the caller waits for it
    pool.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await sent
    assert pool.written == ["sent"]
    assert_clean(b, admission)


async def test_calls_waiting_together_go_in_one_statement_and_each_gets_its_row() -> None:
    pool = Pool()
    b, admission = batcher(pool)
    held = call(b, "held")
    await settle()
    waiting = [call(b, f"op-{n}") for n in (3, 1, 2)]
    await settle()
    pool.gate.set()
    assert await held == {"operation_id": "held"}
    assert [(await w)["operation_id"] for w in waiting] == ["op-3", "op-1", "op-2"]
    assert pool.written == ["held", "op-1", "op-2", "op-3"]  # the batch in the fixed lock order
    assert (b.counts.statements, b.counts.commands) == (2, 4)
    assert_clean(b, admission)


@pytest.mark.parametrize("per_tenant", [False, True])
async def test_a_per_tenant_batcher_sends_one_tenants_calls_a_statement(per_tenant: bool) -> None:
    pool = Pool()
    b, admission = batcher(pool)
    b.per_tenant = per_tenant  # as Pools.open sets it on Citus
    held = call(b, "held")
    await settle()
    sends = [("t2", "b-2"), ("t1", "a-2"), ("t2", "b-1"), ("t1", "a-1"), ("t3", "c-1")]
    waiting = [call(b, op, tenant=tenant) for tenant, op in sends]
    submit = call(b, "a-3", "run_submit")  # another function: a statement of its own either way
    await settle()
    pool.gate.set()
    assert (await held)["operation_id"] == "held"
    assert [(await w)["operation_id"] for w in waiting] == [op for _, op in sends]
    assert (await submit)["operation_id"] == "a-3"
    if per_tenant:  # the oldest waiting call's tenant first; each tenant's calls in the lock order
        assert pool.batches == [
            (sql("run_heartbeat_tenant_batch"), "t2", "50ms", ["b-1", "b-2"]),
            (sql("run_heartbeat_tenant_batch"), "t1", "50ms", ["a-1", "a-2"]),
        ]  # t3's one call and the submit went alone (single statements, not batches)
        assert pool.written == ["held", "b-1", "b-2", "a-1", "a-2", "c-1", "a-3"]
        assert (b.counts.statements, b.counts.commands) == (5, 7)
    else:  # every tenant's calls of one function together, in the lock order (tenant, ID)
        assert pool.batches == [(sql("run_heartbeat_batch"), "50ms", ["a-1", "a-2", "b-1", "b-2", "c-1"])]
        assert pool.written == ["held", "a-1", "a-2", "b-1", "b-2", "c-1", "a-3"]
        assert (b.counts.statements, b.counts.commands) == (3, 7)
    assert_clean(b, admission)


async def test_a_stalled_statement_gives_its_place_to_the_calls_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 0.4 s: each "not yet" below has 0.2 - 0.3 s of margin, so a loaded machine's late wake-ups (CI
    # saw one past 0.02 s at a load of 5) do not stall the second statement before the third's check
    monkeypatch.setattr(batching, "STALL_SECONDS", 0.4)
    pool = Pool()
    b, admission = batcher(pool)
    first = call(b, "first")
    await settle()
    second = call(b, "second", "run_submit")
    await settle()
    assert len(b._waiting) == 1  # one statement in flight: the second waits
    await asyncio.sleep(0.2)
    assert len(b._waiting) == 1  # not yet stalled
    await asyncio.sleep(0.3)
    assert not b._waiting and b._inflight == 1  # the first gave its place; the second went out
    third = call(b, "third", "run_complete")
    await settle()
    assert len(b._waiting) == 1  # the second is in flight, not yet for STALL_SECONDS
    await asyncio.sleep(0.5)
    assert not b._waiting  # the second stalled too: the third went out (all three still held)
    pool.gate.set()
    assert [(await t)["operation_id"] for t in (first, second, third)] == ["first", "second", "third"]
    assert not b._slots or all(not slot.held for slot in b._slots)
    assert_clean(b, admission)


async def test_back_to_back_batches_keep_one_connection_and_give_it_back_once_nothing_waits() -> None:
    pool = Pool()
    b, admission = batcher(pool)
    held = call(b, "held")
    await settle()
    waiting = [call(b, "a", "run_submit"), call(b, "b", "run_complete"), call(b, "c", "run_heartbeat")]
    await settle()
    assert len(pool.acquired) == 1 and len(b._waiting) == 3
    pool.gate.set()
    assert [(await t)["operation_id"] for t in (held, *waiting)] == ["held", "a", "b", "c"]
    await settle()
    assert b.counts.statements == 4  # one statement per function, in arrival order
    assert pool.acquired == pool.released and len(pool.acquired) == 1  # one acquire, one release
    assert_clean(b, admission)


async def test_expired_connections_are_not_reused_for_the_next_batch() -> None:
    pool = Pool()
    b, admission = batcher(pool)
    held = call(b, "held")
    await settle()
    after = call(b, "after", "run_submit")
    await settle()
    pool._generation += 1  # Pool.expire_connections (a failover): the held connection must not go on
    pool.gate.set()
    assert (await held)["operation_id"] == "held" and (await after)["operation_id"] == "after"
    await settle()
    assert len(pool.acquired) == 2 and pool.released == pool.acquired
    assert_clean(b, admission)


async def test_a_failed_statement_gives_its_connection_back_before_the_next_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = Pool()
    b, admission = batcher(pool)
    failing = True

    async def fetchrow(self: Conn, query: str, *args: Any) -> dict[str, Any]:
        await pool.gate.wait()
        if failing and args[1] == "lost":
            self.closed = True
            raise ConnectionResetError("gone")
        return {"operation_id": args[1]}

    monkeypatch.setattr(Conn, "fetchrow", fetchrow)
    lost = call(b, "lost")
    await settle()
    after = call(b, "after", "run_submit")
    await settle()
    pool.gate.set()
    with pytest.raises(ConnectionResetError):
        await lost
    assert (await after)["operation_id"] == "after"
    await settle()
    assert len(pool.acquired) == 2 and pool.released == pool.acquired  # a fresh one for the next batch
    assert_clean(b, admission)


async def test_a_connection_closed_between_two_batches_is_not_reused() -> None:
    pool = Pool()
    b, admission = batcher(pool)
    held = call(b, "held")
    await settle()
    after = call(b, "after", "run_submit")
    await settle()
    pool.acquired[0].closed = "detached"  # terminated while idle between the two statements
    lanes = list(b._tasks)
    pool.gate.set()
    assert (await held)["operation_id"] == "held" and (await after)["operation_id"] == "after"
    await settle()
    assert len(pool.acquired) == 2 and pool.released == pool.acquired
    assert not b._tasks and [lane.exception() for lane in lanes] == [None]  # the lane ended cleanly
    assert_clean(b, admission)


async def test_a_failed_release_changes_no_answer_and_gives_the_place_back() -> None:
    class FailingRelease(Pool):
        @asynccontextmanager
        async def acquire(self, timeout: float | None = None) -> AsyncIterator[Conn]:  # noqa: ASYNC109
            yield Conn(self)
            raise ConnectionResetError("reset failed: asyncpg terminated the connection")

    pool = FailingRelease()
    b, admission = batcher(pool)
    pool.gate.set()
    lanes: list[asyncio.Task[None]] = []

    class Recorded(set):  # type: ignore[type-arg]
        def add(self, task: asyncio.Task[None]) -> None:
            lanes.append(task)
            super().add(task)

    b._tasks = Recorded()
    first = call(b, "first")
    assert (await first)["operation_id"] == "first"  # the committed write is answered as such
    await settle()
    assert [lane.exception() for lane in lanes] == [None]
    second = call(b, "second", "run_submit")  # the place was given back: the next call goes out
    assert (await asyncio.wait_for(second, 1))["operation_id"] == "second"
    await settle()
    assert_clean(b, admission)
