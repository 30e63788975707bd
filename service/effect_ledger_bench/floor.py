"""The Python floor: the same statements through asyncpg in one process, no HTTP.

Two floors are measured. `statements` runs exactly the catalogue statements the service runs, with
values shaped as the service shapes them, inside the service's own `tenant_tx` (pool acquire, BEGIN,
tenant_context, COMMIT, pool release); it is what asyncpg and one event loop cost. `repository` calls
the service's repository functions (ledger.claim and ledger.transition with the real domain decisions),
so the gap between the two is the domain's Python and the gap to the service is HTTP, JWT and JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg

from effect_ledger.db import ledger as repo
from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import lock_for_change
from effect_ledger.db.pools import create_role_pool, tenant_tx
from effect_ledger.db.urls import RUNTIME_ROLE
from effect_ledger.domain.canonical import intent_digest
from effect_ledger.domain.chain import GENESIS_HASH
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.model import Binding, Operation
from effect_ledger.domain.tokens import nonce_hash
from effect_ledger.domain.transitions import Decision, Report, decide_complete, decide_submit
from effect_ledger.settings import Settings
from effect_ledger_bench.stats import LoadResult
from effect_ledger_bench.workload import LEASE_SECONDS, PRINCIPAL, TENANT, TOOL, TOOL_VERSION

Cycle = Callable[[str], Awaitable[None]]
_HASH = hashlib.sha256(b"bench").hexdigest()
_BYTES = hashlib.sha256(b"bench").digest()


def statement_cycle(pool: asyncpg.Pool) -> Cycle:
    """One effect cycle as the service's three transactions, with no domain logic around them."""

    async def write(conn: asyncpg.Connection, op_id: str, status: str, seq: int, **state: object) -> None:
        await lock_for_change(conn, TENANT, op_id)
        now = state["now"]
        await conn.execute(
            sql("apply_change"), TENANT, op_id, status, 1, _BYTES, _BYTES, _BYTES, LEASE_SECONDS,
            state.get("lease"), f"ref-{op_id}", state.get("receipt"), None, now, now, state.get("resolved"),
            state.get("resolved_by"), [seq], [now], [state["kind"]], [PRINCIPAL], [state["before"]], [status],
            [1], [state["data"]], [_HASH], [_HASH], seq, _HASH,
        )

    async def cycle(op_id: str) -> None:
        async with tenant_tx(pool, TENANT, 2.0, "claim") as (conn, now):
            lease = now + timedelta(seconds=LEASE_SECONDS)
            await conn.fetchval(
                sql("insert_first_attempt"), TENANT, op_id, PRINCIPAL, TOOL, TOOL_VERSION,
                "sha256:" + _HASH, _BYTES, _BYTES, _BYTES, LEASE_SECONDS, lease, now,
                {"lease_expires_at": "x"}, GENESIS_HASH, _HASH,
            )
        async with tenant_tx(pool, TENANT, 2.0, "submit") as (conn, now):
            await write(conn, op_id, "submitted", 2, now=now, lease=now + timedelta(seconds=LEASE_SECONDS),
                        kind="submitted", before="pending", data={"effect_ref": f"ref-{op_id}"})
        async with tenant_tx(pool, TENANT, 2.0, "complete") as (conn, now):
            receipt = {"external_ref": f"rcpt-{op_id}", "recorded_by": PRINCIPAL}
            await write(conn, op_id, "committed", 3, now=now, receipt=receipt, resolved=now,
                        resolved_by=PRINCIPAL, kind="completed", before="submitted",
                        data={"outcome": "committed", "receipt": receipt})

    return cycle


def repository_cycle(pool: asyncpg.Pool) -> Cycle:
    """One effect cycle through the service's repository functions and domain decisions."""
    ledger = repo.Ledger(pool, 2.0)
    nonce = "bench-nonce-repository-floor"
    report = Report("committed", {"external_ref": "rcpt", "result_digest": None, "result": None,
                                  "observed_at": None})

    async def cycle(op_id: str) -> None:
        intent = {"op": op_id, "amount_cents": 1250, "currency": "EUR"}
        binding = Binding(PRINCIPAL, TOOL, TOOL_VERSION, intent_digest(intent))
        request = ClaimRequest(op_id, binding, LEASE_SECONDS, nonce_hash(nonce))
        claimed = await repo.claim(ledger, TENANT, request, nonce)
        token = claimed.token
        assert token is not None

        def submit(op: Operation) -> Decision:
            return Decision(decide_submit(op, token, f"ref-{op_id}", None))

        def complete(op: Operation) -> Decision:
            return decide_complete(op, PRINCIPAL, token, report)

        await repo.transition(ledger, TENANT, op_id, submit, "submit")
        await repo.transition(ledger, TENANT, op_id, complete, "complete")

    return cycle


async def run_floor(
    owner_url: str, kind: str, concurrency: int, warmup: float, duration: float, prefix: str
) -> LoadResult:
    """`concurrency` tasks in this one process doing cycles; measured after the warm-up."""
    pool = await create_role_pool(Settings(database_url=owner_url), RUNTIME_ROLE, concurrency)
    try:
        cycle = statement_cycle(pool) if kind == "statements" else repository_cycle(pool)
        start = time.monotonic() + warmup
        end = start + duration
        result = LoadResult(window=duration, generator="in-process", calls={"cycle": []})

        async def worker(index: int) -> None:
            n = 0
            while time.monotonic() < end:
                n += 1
                began = time.monotonic()
                await cycle(f"{prefix}-{index}-{n}")
                finished = time.monotonic()
                if start <= finished < end:
                    result.cycles += 1
                    result.calls["cycle"].append((finished - began) * 1000)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return result
    finally:
        await pool.close()
