"""Round trips per call on the write path, counted on the connection (asyncpg's query logger).

Every statement asyncpg sends is one round trip once it is prepared on the connection (asyncpg caches
prepared statements; each call below runs once first so the count is the steady state). BEGIN and
COMMIT are statements too, so a transaction around a call would show here. The README's table says
the same numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from effect_ledger.db import ledger as repo
from effect_ledger.db.pools import create_role_pool
from effect_ledger.db.urls import RUNTIME_ROLE
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.diagnostics import Incident, new_incident_id
from effect_ledger.domain.model import Binding
from effect_ledger.domain.transitions import Report
from effect_ledger.settings import Settings

TENANT = "t1"
BINDING = Binding("exec-1", "measure", "2.1.0", "sha256:" + "a" * 64)
RECEIPT = {"external_ref": "x-1", "result_digest": None, "result": None, "observed_at": None}
EVIDENCE = {"source": "provider-api", "lookup_ref": None, "checked_at": "2026-11-30T10:00:00.000Z"}


class Counted:
    """A one-connection ledger whose every statement is logged."""

    def __init__(self, ledger: repo.Ledger, log: list[str]) -> None:
        self.ledger, self.log = ledger, log

    async def count(self, call: Callable[[], Awaitable[Any]]) -> int:
        """Statements (round trips) one call sends."""
        self.log.clear()
        await call()
        await asyncio.sleep(0)  # the logger is called soon after each statement
        await asyncio.sleep(0)
        return len(self.log)


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[Counted]:
    log: list[str] = []
    pool = await create_role_pool(settings, RUNTIME_ROLE, 1)
    async with pool.acquire() as conn:
        conn.add_query_logger(lambda record: log.append(record.query))
    try:
        yield Counted(repo.Ledger(pool, 5.0), log)
    finally:
        await pool.close()


def claim_request(op_id: str, submit: bool = False) -> ClaimRequest:
    return ClaimRequest(op_id, BINDING, 30, None, submit=submit, effect_ref="ref" if submit else None)


async def cycle(ledger: repo.Ledger, op_id: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    """The calls of one operation's life, each ready to run once (in this order)."""
    token: list[str] = []

    async def claim() -> None:
        result = await repo.claim(ledger, TENANT, claim_request(op_id), None)
        assert result.verdict == "created" and result.token is not None
        token.append(result.token)

    async def submit() -> None:
        assert (await repo.submit(ledger, TENANT, op_id, token[0], "ref", None)).refusal is None

    async def heartbeat() -> None:
        assert (await repo.heartbeat(ledger, TENANT, op_id, token[0], 60)).refusal is None

    async def complete_unknown() -> None:
        incident = Incident(TENANT, new_incident_id(), "outcome", "exec-1", op_id, phase="request")
        report = Report("unknown", incident=incident.incident_id)
        done = await repo.complete(ledger, TENANT, op_id, "exec-1", token[0], report, incident)
        assert done.refusal is None and done.incident == incident.incident_id

    async def resolve() -> None:
        report = Report("committed", RECEIPT, evidence=EVIDENCE)
        assert (await repo.resolve(ledger, TENANT, op_id, "rec-1", report)).refusal is None

    async def complete_repeat() -> None:  # a late report equal to the recorded outcome: 200, no change
        done = await repo.complete(ledger, TENANT, op_id, "exec-1", token[0], Report("committed", RECEIPT))
        assert done.refusal is None and done.outcome == "unchanged"

    async def claim_reuse() -> None:
        assert (await repo.claim(ledger, TENANT, claim_request(op_id), None)).verdict == "reuse_receipt"

    async def claim_and_submit() -> None:
        result = await repo.claim(ledger, TENANT, claim_request(op_id + "-s", submit=True), None)
        assert result.verdict == "created" and result.operation.status == "submitted"

    return {
        "claim": claim, "submit": submit, "heartbeat": heartbeat, "complete (unknown, with diagnostics)":
        complete_unknown, "resolve": resolve, "complete (repeat)": complete_repeat,
        "claim (reuse_receipt)": claim_reuse, "claim with submit": claim_and_submit,
    }


async def test_every_write_path_call_is_one_round_trip(counted: Counted) -> None:
    warm = await cycle(counted.ledger, "warm")
    for call in warm.values():  # prepare every statement on the connection first
        await call()
    measured = await cycle(counted.ledger, "op")
    counts = {name: await counted.count(call) for name, call in measured.items()}
    assert counts == {
        "claim": 1, "submit": 1, "heartbeat": 1, "complete (unknown, with diagnostics)": 1, "resolve": 1,
        "complete (repeat)": 1, "claim (reuse_receipt)": 1, "claim with submit": 1,
    }
    assert all(query.lstrip().startswith("SELECT") for query in counted.log)  # no BEGIN, no COMMIT


async def test_a_refused_call_is_one_round_trip_too(counted: Counted) -> None:
    ledger = counted.ledger
    granted = await repo.claim(ledger, TENANT, claim_request("busy"), None)
    assert granted.token is not None
    await repo.claim(ledger, TENANT, claim_request("busy"), None)  # warm: prepared
    refused = await counted.count(lambda: repo.claim(ledger, TENANT, claim_request("busy"), None))
    assert refused == 1
    stale = await counted.count(lambda: repo.submit(ledger, TENANT, "busy", "clt_stale", None, None))
    assert stale == 1
    missing = await counted.count(lambda: repo.heartbeat(ledger, TENANT, "nobody", "clt_x", None))
    assert missing == 1


async def test_reads_keep_their_tenant_transaction(counted: Counted) -> None:
    ledger = counted.ledger
    await repo.claim(ledger, TENANT, claim_request("read-me"), None)
    await repo.get_operation(ledger, TENANT, "read-me")
    assert await counted.count(lambda: repo.get_operation(ledger, TENANT, "read-me")) == 4
    assert await counted.count(lambda: repo.list_events(ledger, TENANT, "read-me")) == 4
    assert isinstance(counted.ledger.pool, asyncpg.Pool)
