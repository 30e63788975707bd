"""Natural batching of the write path (db/batching.py): calls that wait for the statement in flight go
to PostgreSQL together, one statement and one commit, and each still gets exactly its own answer.

The batch is made deterministic here: one call is held in flight by a row lock (the worker allows
one statement in flight), the others queue behind it, and the lock's release sends them together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.db import batching
from effect_ledger.db.batching import BatchCounts, WriteBatcher
from effect_ledger.db.catalogue import sql
from effect_ledger.db.pools import batcher_of
from effect_ledger.settings import Settings
from support.auth import auth
from support.database import runtime_connection
from support.ledger import CLAIM, RECEIPT, call, claim, count_events, owner, submitted
from support.server import Service
from support.waiting import until


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # One statement in flight for 40 executors: on a loaded machine (CI's three xdist workers beside
    # the Citus lane) a queued call waited past the default 2 s deadline and got a 503. These tests
    # are about each call's answer in a batch; the deadline and shedding have their own tests.
    return replace(
        settings,
        rate_limit_per_second=0,
        write_concurrency=1,
        write_batch_max=32,
        pool_acquire_timeout_ms=30_000,
        pool_shed_wait_ms=30_000,
    )


@pytest.fixture
async def batched(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Service, WriteBatcher]]:
    """The service's batcher, with the stall release far away: a statement held by a row lock keeps
    its place, so the calls sent meanwhile queue and go together once the lock is released (the stall
    release itself is tested below, with its default)."""
    monkeypatch.setattr(batching, "STALL_SECONDS", 60.0)
    batcher = batcher_of(service.app.state.pools.runtime)
    assert batcher is not None and batcher.limit == 1
    yield service, batcher


def counted(batcher: WriteBatcher) -> BatchCounts:
    return replace(batcher.counts)


async def hold_row(db_url: str, op: str, tenant: str = "t1") -> tuple[asyncpg.Connection, Any]:
    """An owner transaction holding the operation's row lock: a write of it waits in flight."""
    conn = await asyncpg.connect(db_url)
    tx = conn.transaction()
    await tx.start()
    await conn.execute(
        "SELECT 1 FROM ledger.operations WHERE tenant_id = $1 AND operation_id = $2 FOR UPDATE", tenant, op
    )
    return conn, tx


def completing(client: httpx.AsyncClient, op: str, token: str) -> asyncio.Future[httpx.Response]:
    """A complete (committed) sent now, answered later."""
    body = {"token": token, "outcome": "committed", "receipt": RECEIPT}
    return asyncio.ensure_future(call(client, op, "complete", body))


async def in_flight(batcher: WriteBatcher, what: str) -> None:
    await until(lambda: batcher._inflight, what, holds=lambda k: k == 1)


async def waiting_for_the_lock(conn: asyncpg.Connection, what: str) -> None:
    """A backend of this database waits for a row lock (seen by PostgreSQL, not by the batcher: a
    statement keeps its place in flight only STALL_SECONDS, a window a loaded machine can miss)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    await until(lambda: conn.fetchval(query), what, holds=lambda k: k == 1)


async def queued(batcher: WriteBatcher, n: int) -> None:
    await until(lambda: len(batcher._waiting), f"{n} calls waiting", holds=lambda k: k == n)


async def test_waiting_completes_go_together_and_a_failing_one_fails_alone(
    batched: tuple[Service, WriteBatcher], db_url: str
) -> None:
    service, batcher = batched
    async with service.client() as client:
        tokens = {op: await submitted(client, op) for op in ["op-block", *(f"op-{i}" for i in range(10))]}
        before = counted(batcher)
        conn, tx = await hold_row(db_url, "op-block")
        try:
            blocked = completing(client, "op-block", tokens["op-block"])
            await in_flight(batcher, "the held complete in flight")

            def body(op: str) -> dict[str, Any]:
                # U+0000 is valid JSON that jsonb cannot store: PostgreSQL refuses that one command
                receipt = {"external_ref": "bad\u0000ref"} if op == "op-5" else RECEIPT
                return {"token": tokens[op], "outcome": "committed", "receipt": receipt}

            answers = asyncio.gather(
                *(call(client, f"op-{i}", "complete", body(f"op-{i}")) for i in range(10))
            )
            await queued(batcher, 10)
        finally:
            await tx.rollback()
            await conn.close()
        assert (await blocked).status_code == 200
        results = await answers
    by_op = {f"op-{i}": r for i, r in enumerate(results)}
    assert by_op["op-5"].status_code == 422, by_op["op-5"].text
    assert by_op["op-5"].json()["code"] == "validation_failed"
    assert {op: r.status_code for op, r in by_op.items() if op != "op-5"} == {
        f"op-{i}": 200 for i in range(10) if i != 5
    }
    assert all(r.json()["status"] == "committed" for op, r in by_op.items() if op != "op-5")
    after = counted(batcher)
    # the held call alone, then the ten in one statement, which failed and ran each alone
    assert (after.statements - before.statements, after.commands - before.commands) == (2, 11)
    assert after.fallbacks - before.fallbacks == 1
    async with owner(db_url) as conn:
        rows = await conn.fetch(
            "SELECT operation_id, status, chain_seq FROM ledger.operations WHERE tenant_id = 't1'"
        )
    state = {r["operation_id"]: (r["status"], r["chain_seq"]) for r in rows}
    assert state.pop("op-5") == ("submitted", 2)  # nothing of the refused complete was written
    assert set(state.values()) == {("committed", 3)}
    assert await count_events(db_url) == 11 * 3 - 1


# Per tenant: as the batcher runs on Citus (db/pools.Pools.open sets it there; the Citus lane runs this
# case, storage, where it must already be set), each tenant's calls in a statement of their own, the
# function distributed by that tenant (migration 0025); on plain PostgreSQL one statement carries both.
@pytest.mark.parametrize("per_tenant", [False, pytest.param(True, marks=pytest.mark.storage)])
async def test_claims_of_two_tenants_in_one_batch_stay_apart(
    batched: tuple[Service, WriteBatcher], db_url: str, on_citus: bool, per_tenant: bool
) -> None:
    service, batcher = batched
    assert batcher.per_tenant is on_citus
    if on_citus and not per_tenant:
        pytest.skip("on Citus the batcher is per tenant: a batch of two tenants is not delegated")
    batcher.per_tenant = per_tenant
    async with service.client() as client:
        token = await submitted(client, "op-block")
        conn, tx = await hold_row(db_url, "op-block")
        try:
            blocked = completing(client, "op-block", token)
            await in_flight(batcher, "the held complete in flight")
            before = counted(batcher)  # the held complete's statement is counted already
            # the same IDs in both tenants, and each ID twice in t1: one grant, one in-progress answer
            sends = [("t1", f"same-{i}", "exec-1") for i in range(4)] + [
                ("t2", f"same-{i}", "exec-9") for i in range(4)
            ]
            sends += [("t1", f"same-{i}", "exec-1") for i in range(4)]
            answers = asyncio.gather(*(claim(client, op, tenant=t, sub=s) for t, op, s in sends))
            await queued(batcher, len(sends))
        finally:
            await tx.rollback()
            await conn.close()
        assert (await blocked).status_code == 200
        results = await answers
        after = counted(batcher)
        statements = 2 if per_tenant else 1  # t1's 8 calls and t2's 4, apart or together
        assert (after.statements - before.statements, after.commands - before.commands) == (statements, 12)
        assert after.fallbacks == before.fallbacks
        codes = [r.status_code for r in results]
        assert codes[:8] == [201] * 8 and codes[8:] == [409] * 4
        assert {r.json()["code"] for r in results[8:]} == {"operation_in_progress"}
        for tenant, principal in (("t1", "exec-1"), ("t2", "exec-9")):
            r = await client.get("/v1/operations/same-0", headers=auth(tenant=tenant))
            assert r.status_code == 200 and r.json()["principal"] == principal
    async with owner(db_url) as conn:
        tenants = await conn.fetch(
            "SELECT tenant_id, count(*) AS n FROM ledger.operations WHERE operation_id LIKE 'same-%' GROUP BY 1 ORDER BY 1"
        )
    assert [(r["tenant_id"], r["n"]) for r in tenants] == [("t1", 4), ("t2", 4)]


async def test_a_call_with_nothing_waiting_goes_alone_at_once(batched: tuple[Service, WriteBatcher]) -> None:
    service, batcher = batched
    async with service.client() as client:
        before = counted(batcher)
        for i in range(5):
            r = await claim(client, f"alone-{i}")
            assert r.status_code == 201
        after = counted(batcher)
    assert (after.statements - before.statements, after.commands - before.commands) == (5, 5)


async def test_batching_off_uses_no_batcher(settings: Settings) -> None:
    async with Service(replace(settings, write_batch_max=1)) as service, service.client() as client:
        assert batcher_of(service.app.state.pools.runtime) is None
        r = await claim(client, "off-1", CLAIM)
        assert r.status_code == 201


async def test_many_concurrent_cycles_each_get_their_answers(
    batched: tuple[Service, WriteBatcher], db_url: str
) -> None:
    """No lock held: 40 executors in full cycles against one statement in flight; batches form by
    themselves, and every cycle ends committed with its three chained events."""
    service, batcher = batched
    before = counted(batcher)
    limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
    async with service.client(limits=limits) as client:

        async def cycle(n: int) -> tuple[int, ...]:
            r1 = await claim(client, f"cy-{n}")
            token = r1.json()["claim"]["token"]
            r2 = await call(client, f"cy-{n}", "submit", {"token": token})
            r3 = await call(client, f"cy-{n}", "heartbeat", {"token": token, "lease_seconds": 60})
            r4 = await call(
                client, f"cy-{n}", "complete", {"token": token, "outcome": "committed", "receipt": RECEIPT}
            )
            return r1.status_code, r2.status_code, r3.status_code, r4.status_code

        codes = await asyncio.gather(*(cycle(n) for n in range(40)))
    assert set(codes) == {(201, 200, 200, 200)}
    after = counted(batcher)
    assert after.commands - before.commands == 160
    assert after.statements - before.statements < 160  # some calls went together
    assert after.fallbacks == before.fallbacks  # every batch statement ran as one
    assert await count_events(db_url) == 120


async def test_a_command_behind_a_held_row_lock_does_not_hold_up_its_batch(
    batched: tuple[Service, WriteBatcher], db_url: str
) -> None:
    """The batch waits at most BATCH_LOCK_TIMEOUT for a row; then its commands run alone side by side:
    the others answer while the lock is still held, the held one when it is released."""
    service, batcher = batched
    async with service.client() as client:
        ops = ["op-gate", "op-held", *(f"op-{i}" for i in range(5))]
        tokens = {op: await submitted(client, op) for op in ops}

        def done(op: str) -> asyncio.Future[httpx.Response]:
            return completing(client, op, tokens[op])

        gate_conn, gate_tx = await hold_row(db_url, "op-gate")
        held_conn, held_tx = await hold_row(db_url, "op-held")
        try:
            gate = done("op-gate")
            await in_flight(batcher, "the gate's complete in flight")
            before = counted(batcher)
            held = done("op-held")
            others = [done(f"op-{i}") for i in range(5)]
            await queued(batcher, 6)
            await gate_tx.rollback()  # the gate goes; the six go together and meet op-held's lock
            assert (await gate).status_code == 200
            answers = await asyncio.gather(*others)
            assert [r.status_code for r in answers] == [200] * 5
            assert not held.done()  # still waiting for its row, alone
            after = counted(batcher)
            assert (after.statements - before.statements, after.commands - before.commands) == (1, 6)
            assert after.fallbacks - before.fallbacks == 1
        finally:
            await held_tx.rollback()
            await gate_conn.close()
            await held_conn.close()
        r = await held
        assert r.status_code == 200 and r.json()["status"] == "committed"


async def test_a_statement_stalled_on_a_lock_gives_its_place_to_the_calls_behind_it(
    service: Service, db_url: str
) -> None:
    """With the default stall release: one write slot, held by a complete waiting for a row lock; new
    claims still go through (after at most STALL_SECONDS) while the lock is held."""
    batcher = batcher_of(service.app.state.pools.runtime)
    assert batcher is not None and batcher.limit == 1
    async with service.client() as client:
        token = await submitted(client, "op-held")
        conn, tx = await hold_row(db_url, "op-held")
        try:
            held = completing(client, "op-held", token)
            await waiting_for_the_lock(conn, "the held complete waiting for the row lock")
            codes = [(await claim(client, f"free-{i}")).status_code for i in range(5)]
            assert codes == [201] * 5
            assert not held.done()
        finally:
            await tx.rollback()
            await conn.close()
        assert (await held).status_code == 200


DIGEST = "sha256:" + "a" * 64


@pytest.mark.storage
async def test_a_tenant_batch_refuses_a_command_of_another_tenant_and_writes_nothing(db_url: str) -> None:
    """The per-tenant batch functions (0025) run every command under their tenant argument: a command
    that names another tenant fails the whole statement before any command runs."""
    conn = await runtime_connection(db_url)
    try:
        commands = [
            (0, "t1", "mixed-1", "exec-1", "tool", "1", DIGEST, 30, None, b"h" * 32, None, False, None, None),
            (1, "t2", "mixed-2", "exec-1", "tool", "1", DIGEST, 30, None, b"h" * 32, None, False, None, None),
        ]
        with pytest.raises(asyncpg.InvalidParameterValueError, match="a command of another"):
            await conn.fetch(sql("run_claim_tenant_batch"), "t1", "50ms", commands)
        rows = await conn.fetch(sql("run_claim_tenant_batch"), "t1", "50ms", commands[:1])
        assert [(r["i"], r["outcome"], r["op"]["operation_id"]) for r in rows] == [(0, "created", "mixed-1")]
    finally:
        await conn.close()
    async with owner(db_url) as conn:
        stored = await conn.fetch(
            "SELECT tenant_id, operation_id FROM ledger.operations WHERE operation_id LIKE 'mixed-%' ORDER BY 2"
        )
    assert [tuple(r) for r in stored] == [("t1", "mixed-1")]
