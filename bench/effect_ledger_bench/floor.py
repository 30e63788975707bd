"""The Python floor: the same statements through asyncpg in one process, no HTTP.

Two floors are measured. `statements` runs exactly the catalogue statements the service runs (one
write-path function call per call, autocommit, pool acquire and release around each), with values
shaped as the service shapes them; it is what asyncpg and one event loop cost. `repository` calls the
service's repository functions (ledger.claim, submit, complete with the domain around them), so the
gap between the two is the domain's Python and the gap to the service is HTTP, JWT and JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable

import asyncpg

from effect_ledger.db import ledger as repo
from effect_ledger.db.catalogue import sql
from effect_ledger.db.pools import create_role_pool
from effect_ledger.db.urls import RUNTIME_ROLE
from effect_ledger.domain.canonical import intent_digest
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.model import Binding
from effect_ledger.domain.tokens import nonce_hash
from effect_ledger.domain.transitions import Report
from effect_ledger.settings import Settings
from effect_ledger_bench.stats import LoadResult
from effect_ledger_bench.workload import LEASE_SECONDS, PRINCIPAL, TENANT, TOOL, TOOL_VERSION

Cycle = Callable[[str], Awaitable[None]]
_HASH = hashlib.sha256(b"bench").hexdigest()
_BYTES = hashlib.sha256(b"bench").digest()


def statement_cycle(pool: asyncpg.Pool) -> Cycle:
    """One effect cycle as the service's three statements (one round trip each), no domain logic."""
    token_hash = hashlib.sha256(b"bench-token").digest()
    receipt = '{"external_ref":"rcpt","observed_at":null,"result":null,"result_digest":null}'

    async def cycle(op_id: str) -> None:
        async with pool.acquire() as conn:
            await conn.fetchrow(
                sql("run_claim"),
                TENANT,
                op_id,
                PRINCIPAL,
                TOOL,
                TOOL_VERSION,
                "sha256:" + _HASH,
                LEASE_SECONDS,
                _BYTES,
                token_hash,
                None,
                False,
                None,
                None,  # no approval policy covers the bench's tool
            )
        async with pool.acquire() as conn:
            await conn.fetchrow(sql("run_submit"), TENANT, op_id, token_hash, f"ref-{op_id}", None)
        async with pool.acquire() as conn:
            await conn.fetchrow(
                sql("run_complete"), TENANT, op_id, PRINCIPAL, token_hash, "committed", receipt, None, None
            )

    return cycle


def repository_cycle(pool: asyncpg.Pool) -> Cycle:
    """One effect cycle through the service's repository functions and domain decisions."""
    ledger = repo.Ledger(pool, 2.0)
    nonce = "bench-nonce-repository-floor"
    report = Report(
        "committed", {"external_ref": "rcpt", "result_digest": None, "result": None, "observed_at": None}
    )

    async def cycle(op_id: str) -> None:
        intent = {"op": op_id, "amount_cents": 1250, "currency": "EUR"}
        binding = Binding(PRINCIPAL, TOOL, TOOL_VERSION, intent_digest(intent))
        request = ClaimRequest(op_id, binding, LEASE_SECONDS, nonce_hash(nonce))
        claimed = await repo.claim(ledger, TENANT, request, nonce)
        token = claimed.token
        assert token is not None
        await repo.submit(ledger, TENANT, op_id, token, f"ref-{op_id}", None)
        await repo.complete(ledger, TENANT, op_id, PRINCIPAL, token, report)

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
