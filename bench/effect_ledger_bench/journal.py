"""9. The run journal: appends of 5-record batches and projections of 1,000-record sessions, through the
service over HTTP and, for comparison, the same statements on asyncpg alone (no HTTP, auth or domain).

The HTTP load comes from this process (the bench's minimal keep-alive client, one connection per
orchestrator), so on a small machine the generator competes with the service for CPU: the notes say so.
Each writer appends to its own session (no revision conflicts);
a full session is replaced by a new one outside the measured time.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import msgspec

from effect_ledger.db import journal as repo
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import create_role_pool, tenant_tx
from effect_ledger.db.urls import RUNTIME_ROLE
from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.journal_history import AppendCommand, Caps
from effect_ledger.settings import Settings
from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.httpclient import HttpConnection
from effect_ledger_bench.report import Row
from effect_ledger_bench.stats import LoadResult

BATCH = 5
SCOPE = "journal:write journal:read"
PRINCIPAL = "bench-orchestrator"
TEXT = "The measured latency of the prototype, with its window and its unit, as the model wrote it. " * 2
Step = Callable[[int], Awaitable[bool]]  # worker index -> whether the answer was the expected one


@dataclass(frozen=True)
class JournalConfig:
    """Sizes of the journal row."""

    writers: int
    readers: int
    warmup: float
    duration: float
    session_records: int = 1000  # records per projected session
    sessions: int = 16  # projected sessions


def batch() -> list[dict[str, Any]]:
    """Five messages (the same shape every time: the figure is about the journal, not the content)."""
    return [
        {"type": "message", "role": ("user", "assistant")[i % 2], "content": TEXT, "schema": 1}
        for i in range(BATCH)
    ]


def history(size: int) -> list[dict[str, Any]]:
    """A 1,000-record session: a request, then call / result / answer triples naming ledger operations."""
    records: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": TEXT, "schema": 1}]
    n = 0
    while len(records) < size:
        n += 1
        cid = f"c{n}"
        records += [
            {
                "type": "tool_call",
                "call_id": cid,
                "name": "measure",
                "arguments": {"n": n},
                "operation_id": f"journal-op-{n}",
                "schema": 1,
            },
            {
                "type": "tool_result",
                "call_id": cid,
                "name": "measure",
                "output": {"value": n},
                "is_error": False,
                "schema": 1,
            },
            {"type": "message", "role": "assistant", "content": TEXT, "schema": 1},
        ]
    return records[:size]


async def timed(concurrency: int, warmup: float, duration: float, step: Step, call: str) -> LoadResult:
    """`concurrency` tasks repeating `step`; latencies of the steps that end inside the window."""
    start = time.monotonic() + warmup
    end = start + duration
    result = LoadResult(window=duration, generator="in-process", calls={call: []})

    async def worker(index: int) -> None:
        while time.monotonic() < end:
            began = time.monotonic()
            ok = await step(index)
            finished = time.monotonic()
            if start <= finished < end:
                result.requests += 1
                result.calls[call].append((finished - began) * 1000)
                if not ok:
                    result.errors[call] = result.errors.get(call, 0) + 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return result


class _Writer:
    """One session per writer, replaced when the next batch would not fit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sessions: list[str] = []
        self.revisions: list[int] = []


def _connections(base_url: str, token: str, count: int) -> list[HttpConnection]:
    """One keep-alive connection per simulated orchestrator (the bench's low-CPU client)."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None
    return [HttpConnection(parts.hostname, parts.port, f"Bearer {token}") for _ in range(count)]


async def _http_appends(base_url: str, token: str, config: JournalConfig) -> LoadResult:
    connections = _connections(base_url, token, config.writers)
    state = _Writer(1000)
    body_of = msgspec.json.Encoder()
    records = batch()

    async def new_session(i: int) -> str:
        status, answer = await connections[i].request("POST", "/v1/sessions", b"{}")
        assert status == 201, status
        return str(msgspec.json.decode(answer)["session_id"])

    try:
        state.sessions = [await new_session(i) for i in range(config.writers)]
        state.revisions = [0] * config.writers

        async def step(i: int) -> bool:
            if state.revisions[i] + BATCH > state.limit:
                state.sessions[i], state.revisions[i] = await new_session(i), 0
            body = body_of.encode({"expected_revision": state.revisions[i], "records": records})
            status, answer = await connections[i].request(
                "POST", f"/v1/sessions/{state.sessions[i]}/records", body
            )
            if status == 200:
                state.revisions[i] = msgspec.json.decode(answer)["revision"]
            return status == 200

        return await timed(config.writers, config.warmup, config.duration, step, "append")
    finally:
        await asyncio.gather(*(c.close() for c in connections))


async def _sql_appends(pool: asyncpg.Pool, tenant: str, config: JournalConfig) -> LoadResult:
    """The append's statements alone: bind the tenant, lock the session, advance it and insert 5 rows."""
    records = batch()
    schemas = [1] * BATCH
    sizes = [len(canonical_json(r)) for r in records]  # measured once, as the service does per append
    state = _Writer(1000)

    async def new_session() -> str:
        sid = "ses_" + secrets.token_urlsafe(18)
        async with tenant_tx(pool, tenant, 5.0) as (conn, now):
            await conn.fetchrow(sql("journal_create_session"), tenant, sid, PRINCIPAL, {}, now)
        return sid

    state.sessions = [await new_session() for _ in range(config.writers)]
    state.revisions = [0] * config.writers

    async def step(i: int) -> bool:
        if state.revisions[i] + BATCH > state.limit:
            state.sessions[i], state.revisions[i] = await new_session(), 0
        base, sid = state.revisions[i], state.sessions[i]
        async with tenant_tx(pool, tenant, 5.0) as (conn, now):
            await conn.fetchrow(sql("journal_lock_session"), tenant, sid, PRINCIPAL)
            stored = await conn.fetch(
                sql("journal_append"),
                tenant,
                sid,
                base,
                base + BATCH,
                {},
                None,
                "sha256:bench",
                now,
                records,
                schemas,
                sizes,
            )
        state.revisions[i] = base + BATCH
        return len(stored) == BATCH

    return await timed(config.writers, config.warmup, config.duration, step, "append")


async def _seed_sessions(pool: asyncpg.Pool, tenant: str, config: JournalConfig) -> list[str]:
    """Sessions of session_records records each, through the repository (100-record batches)."""
    ledger = Ledger(pool, 5.0)
    records = history(config.session_records)
    sessions = []
    for _ in range(config.sessions):
        sid = "ses_" + secrets.token_urlsafe(18)
        await repo.create_session(ledger, tenant, PRINCIPAL, sid, {})
        for base in range(0, len(records), 100):
            decision = await repo.append(
                ledger, tenant, PRINCIPAL, sid, AppendCommand(base, records[base : base + 100]), Caps()
            )
            assert not isinstance(decision, Exception), decision
        sessions.append(sid)
    return sessions


async def _http_projections(
    base_url: str, token: str, sessions: list[str], config: JournalConfig
) -> LoadResult:
    connections = _connections(base_url, token, config.readers)
    turn = itertools.count()  # round-robin over the sessions

    async def step(i: int) -> bool:
        status, _ = await connections[i].request(
            "GET", f"/v1/sessions/{sessions[next(turn) % len(sessions)]}/projection"
        )
        return status == 200

    try:
        return await timed(config.readers, config.warmup, config.duration, step, "projection")
    finally:
        await asyncio.gather(*(c.close() for c in connections))


async def _sql_projections(
    pool: asyncpg.Pool, tenant: str, sessions: list[str], config: JournalConfig
) -> LoadResult:
    """The projection's statements alone, in its read-only snapshot; no reducer, no JSON answer."""
    turn = itertools.count()  # round-robin over the sessions

    async def step(_: int) -> bool:
        sid = sessions[next(turn) % len(sessions)]
        async with tenant_tx(pool, tenant, 5.0, snapshot=True) as (conn, _now):
            head = await conn.fetchrow(sql("journal_read_session"), tenant, sid, PRINCIPAL)
            rows = await conn.fetch(sql("journal_read_records"), tenant, sid, 0)
            ops = sorted({r["record"]["operation_id"] for r in rows if r["record"].get("operation_id")})
            await conn.fetch(sql("journal_effects"), tenant, ops)
        return head is not None and len(rows) == config.session_records

    return await timed(config.readers, config.warmup, config.duration, step, "projection")


def _note(r: LoadResult, what: str) -> str:
    errors = sum(r.errors.values())
    return f"{what}, {errors} unexpected answers"


async def run_journal(
    owner_url: str,
    base_url: str,
    token_for: Callable[[str, str, str], str],
    config: JournalConfig,
    progress: Callable[[str], None],
) -> list[Row]:
    """The journal rows: HTTP appends and projections, each beside asyncpg doing the same statements."""
    tenant_http, tenant_sql = "bench-journal", "bench-journal-sql"
    token = token_for(tenant_http, PRINCIPAL, SCOPE)
    pool = await create_role_pool(
        Settings(database_url=owner_url), RUNTIME_ROLE, max(config.writers, config.readers) + 2
    )
    rows: list[Row] = []
    try:
        progress(f"journal: appends of {BATCH}-record batches, {config.writers} writers over HTTP")
        http_appends = await _http_appends(base_url, token, config)
        progress("journal: the same inserts on asyncpg alone")
        sql_appends = await _sql_appends(pool, tenant_sql, config)
        ratio = (
            http_appends.request_rate / sql_appends.request_rate if sql_appends.request_rate else float("nan")
        )
        rows.append(
            Row(
                "6",
                f"journal: appends, {BATCH}-record batches, {config.writers} writers",
                f"{http_appends.request_rate:,.0f} appends/s",
                http_appends.latency("append"),
                notes=_note(http_appends, f"over HTTP from this process; {ratio:.2f} x PostgreSQL alone"),
            )
        )
        rows.append(
            Row(
                "6",
                "journal: PostgreSQL alone, same inserts",
                f"{sql_appends.request_rate:,.0f} appends/s",
                sql_appends.latency("append"),
                notes=_note(sql_appends, "asyncpg: tenant bind, lock, advance + insert"),
            )
        )
        progress(f"journal: seeding {config.sessions} sessions of {config.session_records:,} records")
        sessions = await _seed_sessions(pool, tenant_http, config)
        sql_sessions = await _seed_sessions(pool, tenant_sql, config)
        progress(f"journal: projections, {config.readers} readers over HTTP, then asyncpg alone")
        http_reads = await _http_projections(base_url, token, sessions, config)
        sql_reads = await _sql_projections(pool, tenant_sql, sql_sessions, config)
        ratio = http_reads.request_rate / sql_reads.request_rate if sql_reads.request_rate else float("nan")
        rows.append(
            Row(
                "6",
                f"journal: projections, {config.session_records:,}-record sessions",
                f"{http_reads.request_rate:,.0f} reads/s",
                http_reads.latency("projection"),
                notes=_note(http_reads, f"reducer + ledger lookup; {ratio:.2f} x PostgreSQL alone"),
            )
        )
        rows.append(
            Row(
                "6",
                "journal: PostgreSQL alone, same reads",
                f"{sql_reads.request_rate:,.0f} reads/s",
                sql_reads.latency("projection"),
                notes=_note(sql_reads, "asyncpg: session, records, ledger lookup in one snapshot"),
            )
        )
    finally:
        await pool.close()
    return rows
