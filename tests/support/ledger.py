"""Helpers for the reconciliation, audit and maintenance tests: HTTP flows, owner SQL, bulk seeding."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx

from effect_ledger.db.urls import RUNTIME_ROLE, derived_password
from effect_ledger.domain.note import parse_checkpoint, parse_note
from support.auth import auth
from support.waiting import until

CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}, "lease_seconds": 30}
RECEIPT = {"external_ref": "m-7", "result": {"value": 21.5}}
REASON = {"category": "rejected", "detail_code": "quota"}
EVIDENCE = {"source": "provider-api", "lookup_ref": "req-19", "checked_at": "2026-11-30T10:00:00Z"}
RECONCILER = {"sub": "rec-1", "scope": "ledger:reconcile"}
AUDITOR = {"sub": "aud-1", "scope": "ledger:audit"}


async def claim(
    client: httpx.AsyncClient, op: str, body: dict[str, Any] | None = None, **who: str
) -> httpx.Response:
    """POST claim with the default body."""
    return await client.post(f"/v1/operations/{op}/claim", json=body or CLAIM, headers=auth(**who))


async def call(
    client: httpx.AsyncClient, op: str, name: str, body: dict[str, Any], **who: str
) -> httpx.Response:
    """POST one of the operation's calls (submit, complete, resolve, ...)."""
    return await client.post(f"/v1/operations/{op}/{name}", json=body, headers=auth(**who))


async def resolve(
    client: httpx.AsyncClient, op: str, outcome: str, sub: str = "rec-1", tenant: str = "t1", **extra: Any
) -> httpx.Response:
    """A reconciler's resolve with evidence (receipt/reason as given)."""
    body = {"outcome": outcome, "evidence": EVIDENCE, **extra}
    return await call(client, op, "resolve", body, tenant=tenant, sub=sub, scope="ledger:reconcile")


async def get(
    client: httpx.AsyncClient, path: str, params: dict[str, Any] | None = None, **who: str
) -> httpx.Response:
    """GET with a caller's token."""
    return await client.get(path, params=params, headers=auth(**who))


async def pending(client: httpx.AsyncClient, op: str, tenant: str = "t1", **body: Any) -> str:
    """A claimed operation; returns its token."""
    r = await claim(client, op, {**CLAIM, **body}, tenant=tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["claim"]["token"])


async def submitted(client: httpx.AsyncClient, op: str, tenant: str = "t1", **body: Any) -> str:
    """A claimed and submitted operation; returns its token."""
    token = await pending(client, op, tenant, **body)
    r = await call(client, op, "submit", {"token": token, "effect_ref": f"ref-{op}"}, tenant=tenant)
    assert r.status_code == 200, r.text
    return token


async def unknown(client: httpx.AsyncClient, op: str, tenant: str = "t1", **body: Any) -> str:
    """An operation its executor reported unknown; returns its token."""
    token = await submitted(client, op, tenant, **body)
    r = await call(client, op, "complete", {"token": token, "outcome": "unknown"}, tenant=tenant)
    assert r.status_code == 200 and r.json()["status"] == "unknown", r.text
    return token


async def committed(
    client: httpx.AsyncClient,
    op: str,
    tenant: str = "t1",
    sub: str = "exec-1",
    receipt: dict[str, Any] | None = None,
    **body: Any,
) -> httpx.Response:
    """An operation its executor completed as committed."""
    r = await claim(client, op, {**CLAIM, **body}, tenant=tenant, sub=sub)
    token = r.json()["claim"]["token"]
    done = {"token": token, "outcome": "committed", "receipt": receipt or RECEIPT}
    r = await call(client, op, "complete", done, tenant=tenant, sub=sub)
    assert r.status_code == 200, r.text
    return r


async def not_applied(client: httpx.AsyncClient, op: str, tenant: str = "t1") -> None:
    """An operation its executor completed as not_applied before submitting."""
    token = await pending(client, op, tenant)
    r = await call(
        client, op, "complete", {"token": token, "outcome": "not_applied", "reason": REASON}, tenant=tenant
    )
    assert r.status_code == 200, r.text


@asynccontextmanager
async def owner(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the owner (the test server's superuser)."""
    conn = await asyncpg.connect(db_url)
    # binary, so that COPY (seed) can send jsonb too: version byte 1, then the JSON text
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        format="binary",
        encoder=lambda value: b"\x01" + json.dumps(value).encode(),
        decoder=lambda raw: json.loads(raw[1:]),
    )
    try:
        yield conn
    finally:
        await conn.close()


async def runtime(db_url: str) -> asyncpg.Connection:
    """A connection as the service's runtime role."""
    return await asyncpg.connect(db_url, user=RUNTIME_ROLE, password=derived_password(db_url, RUNTIME_ROLE))


async def expire_lease(db_url: str, op: str, tenant: str = "t1") -> None:
    """Move the lease into the past, as the database clock would after waiting it out."""
    async with owner(db_url) as conn:
        await conn.execute(
            "UPDATE ledger.operations SET lease_expires_at = now() - interval '1 second'"
            " WHERE tenant_id = $1 AND operation_id = $2",
            tenant,
            op,
        )


async def stored_status(db_url: str, op: str, tenant: str = "t1") -> str | None:
    """The status column as stored (not the effective status)."""
    async with owner(db_url) as conn:
        value = await conn.fetchval(
            "SELECT status FROM ledger.operations WHERE tenant_id = $1 AND operation_id = $2", tenant, op
        )
    return None if value is None else str(value)


async def events_of(db_url: str, op: str, tenant: str = "t1") -> list[asyncpg.Record]:
    """The operation's event rows in seq order."""
    async with owner(db_url) as conn:
        return list(
            await conn.fetch(
                "SELECT * FROM ledger.events WHERE tenant_id = $1 AND operation_id = $2 ORDER BY seq",
                tenant,
                op,
            )
        )


async def count_events(db_url: str) -> int:
    """Every event in the database."""
    async with owner(db_url) as conn:
        return int(await conn.fetchval("SELECT count(*) FROM ledger.events"))


@dataclass(frozen=True)
class Seed:
    """Bulk rows for paging and plan tests, written straight to the table as the owner."""

    tenant: str
    operation_id: str
    status: str
    created_at: datetime
    lease_expires_at: datetime | None = None
    tool: str = "measure"
    principal: str = "exec-1"
    resolved_at: datetime | None = None
    updated_at: datetime | None = None


SEED_COLUMNS = (
    "tenant_id",
    "operation_id",
    "principal",
    "tool",
    "tool_version",
    "intent_digest",
    "status",
    "attempt",
    "claim_token_hash",
    "lease_seconds",
    "lease_expires_at",
    "receipt",
    "not_applied_reason",
    "created_at",
    "updated_at",
    "submitted_at",
    "resolved_at",
    "resolved_by",
)


async def seed(conn: asyncpg.Connection, rows: Iterable[Seed], *, copy: bool = True) -> None:
    """Write operations into ledger.operations: COPY as a superuser, INSERT where RLS applies."""
    records = []
    for s in rows:
        terminal = s.status in ("committed", "not_applied")
        resolved = s.resolved_at or (s.created_at + timedelta(seconds=1) if terminal else None)
        records.append(
            (
                s.tenant,
                s.operation_id,
                s.principal,
                s.tool,
                "1.0",
                "sha256:" + "0" * 64,
                s.status,
                1,
                b"\0" * 32,
                30,
                s.lease_expires_at,
                {
                    **RECEIPT,
                    "result_digest": None,
                    "observed_at": None,
                    "recorded_by": s.principal,
                    "recorded_at": None,
                }
                if s.status == "committed"
                else None,
                REASON if s.status == "not_applied" else None,
                s.created_at,
                s.updated_at or resolved or s.created_at,
                s.created_at if s.status in ("submitted", "unknown", "committed") else None,
                resolved,
                s.principal if terminal else None,
            )
        )
    if copy:
        await conn.copy_records_to_table(
            "operations", schema_name="ledger", columns=SEED_COLUMNS, records=records
        )
        return
    placeholders = ", ".join(f"${n}" for n in range(1, len(SEED_COLUMNS) + 1))
    await conn.executemany(
        f"INSERT INTO ledger.operations ({', '.join(SEED_COLUMNS)}) VALUES ({placeholders})", records
    )


# The members of the operation view (docs/api.md section 5), as every operation answer carries them
# (log_index: API.md section 14, on the write calls' answers too since migration 0027).
VIEW_KEYS = frozenset(
    {
        "operation_id",
        "principal",
        "tool",
        "tool_version",
        "intent_digest",
        "status",
        "attempt",
        "lease_expires_at",
        "lease_expired",
        "effect_ref",
        "receipt",
        "not_applied_reason",
        "created_at",
        "updated_at",
        "submitted_at",
        "resolved_at",
        "resolved_by",
        "log_index",
    }
)


async def checkpoint_of(client: httpx.AsyncClient, tenant: str = "t1") -> tuple[int, str]:
    """The size and text of the tenant's latest signed checkpoint (0 and "" before the first)."""
    r = await get(client, "/v1/log/checkpoint", tenant=tenant, **AUDITOR)
    if r.status_code == 404:
        return 0, ""
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return parse_checkpoint(parse_note(r.text).text).size, r.text


async def wait_for_size(client: httpx.AsyncClient, size: int, tenant: str = "t1") -> str:
    """The text of the first checkpoint of at least `size` leaves, which must be exactly `size`."""
    got = await until(
        lambda: checkpoint_of(client, tenant), f"checkpoint of size {size}", holds=lambda a: a[0] >= size
    )
    assert got[0] == size
    return got[1]
