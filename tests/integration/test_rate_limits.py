"""429 rate_limited per tenant+principal (docs/api.md sections 4 and 11), checked before any database work.

The limited tenant's override refills one token every 1,000 s, so the only tokens a test can spend
are the burst: the counts below are exact whatever the machine's speed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.domain.ratelimit import Bucket, Limit, take
from effect_ledger.http.ratelimit import (
    MemoryStore,
    SharedStore,
    bucket_key,
    create_shared_store,
    parse_overrides,
)
from effect_ledger.settings import Settings
from support.auth import auth
from support.metrics import by_label, samples
from support.server import Service

BURST = 5
OVERRIDES = json.dumps(
    {
        "t-lim": {"per_second": 0.001, "burst": BURST},  # one token per 1,000 s: only the burst counts
        "t-off": {"per_second": 0, "burst": 0},  # 0 switches the limit off for this tenant
    }
)
CLAIM = {"tool": "t", "tool_version": "1", "intent": {}, "lease_seconds": 600}
CLAIM_ROUTE = "/v1/operations/{operation_id}/claim"


@pytest.fixture
def limited(settings: Settings) -> Settings:
    return replace(settings, rate_limit_overrides=OVERRIDES)


async def claim(
    http: httpx.AsyncClient, op: str, tenant: str = "t-lim", sub: str = "exec-1", body: Any = None
) -> httpx.Response:
    return await http.post(
        f"/v1/operations/{op}/claim", json=CLAIM if body is None else body, headers=auth(tenant, sub)
    )


async def test_past_the_burst_429_with_retry_after_for_that_principal_only(limited: Settings) -> None:
    async with Service(limited) as service, httpx.AsyncClient(base_url=service.base_url) as http:
        first = [await claim(http, f"op-{n}") for n in range(BURST)]
        assert [r.status_code for r in first] == [201] * BURST
        refused = [await claim(http, f"op-x{n}") for n in range(3)]
        assert [r.status_code for r in refused] == [429] * 3
        for r in refused:
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["code"] == "rate_limited" and r.json()["status"] == 429
            # (1 - tokens) / rate, rounded up: at most 1,000 s, at least 1
            assert 1 <= int(r.headers["retry-after"]) <= 1000
        # the same tenant's other principal has its own bucket; another tenant has the default limit
        assert (await claim(http, "op-b", sub="exec-2")).status_code == 201
        assert (await claim(http, "op-c", tenant="t-other")).status_code == 201
        # every route with a token shares the principal's bucket
        read = await http.get("/v1/operations/op-0", headers=auth("t-lim", "exec-1"))
        assert read.status_code == 429
        metrics = samples((await http.get("/metrics")).text)
    assert by_label(metrics, "effect_ledger_rate_limited_total", "route") == {
        CLAIM_ROUTE: 3,
        "/v1/operations/{operation_id}": 1,
    }


async def test_refused_before_the_body_is_read_and_before_the_database(
    limited: Settings, db_url: str
) -> None:
    """With the operations table locked, a claim that reached the database would wait and fail (503):
    the limited caller gets 429 at once, and even a malformed body is not looked at."""
    config = replace(limited, lock_timeout_ms=5000, statement_timeout_ms=10000)
    async with Service(config) as service, httpx.AsyncClient(base_url=service.base_url, timeout=30) as http:
        for n in range(BURST):
            assert (await claim(http, f"op-{n}")).status_code == 201
        owner = await asyncpg.connect(db_url)
        try:
            async with owner.transaction():
                await owner.execute("LOCK TABLE ledger.operations IN ACCESS EXCLUSIVE MODE")
                assert (await claim(http, "op-locked")).status_code == 429
                malformed = await http.post(
                    "/v1/operations/op-y/claim",
                    content=b"{not json",
                    headers={**auth("t-lim"), "content-type": "application/json"},
                )
                assert malformed.status_code == 429
        finally:
            await owner.close()
        count = await _operations(db_url, "t-lim")
    assert count == BURST


async def test_zero_switches_the_limit_off(settings: Settings) -> None:
    off = replace(settings, rate_limit_per_second=0, rate_limit_overrides=OVERRIDES)
    async with Service(off) as service, httpx.AsyncClient(base_url=service.base_url) as http:
        # the default is off; the override of t-lim still applies to t-lim
        statuses = [(await claim(http, f"op-{n}", tenant="t-any")).status_code for n in range(BURST * 3)]
        assert statuses == [201] * (BURST * 3)
        statuses = [(await claim(http, f"op-{n}", tenant="t-off")).status_code for n in range(BURST * 3)]
        assert statuses == [201] * (BURST * 3)
        statuses = [(await claim(http, f"op-{n}")).status_code for n in range(BURST + 1)]
        assert statuses == [201] * BURST + [429]


async def _operations(db_url: str, tenant: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM ledger.operations WHERE tenant_id = $1", tenant))
    finally:
        await conn.close()


# --- the bucket itself and its stores (no database) -------------------------------------------


def test_bucket_refills_at_the_rate_up_to_the_burst() -> None:
    limit = Limit(rate=2.0, burst=3.0)
    verdict = take(None, limit, 100.0)
    assert verdict == take(None, limit, 100.0) and verdict.bucket == Bucket(2.0, 100.0)
    empty = Bucket(0.0, 100.0)
    assert take(empty, limit, 100.0).retry_after == 1  # (1 - 0) / 2 = 0.5 s, rounded up to 1
    assert take(empty, limit, 100.5).retry_after is None  # half a second refilled one token
    assert take(Bucket(0.0, 100.0), Limit(0.25, 1.0), 100.0).retry_after == 4
    assert take(Bucket(0.0, 100.0), limit, 1000.0).bucket == Bucket(2.0, 1000.0)  # capped at the burst
    assert Bucket(1.0, 10.0).full_at(limit) == 11.0


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "shared-file"])
def test_stores_give_each_key_its_own_bucket(tmp_path: Any, shared: bool) -> None:
    limit = Limit(rate=0.001, burst=2.0)
    if shared:
        create_shared_store(tmp_path / "buckets", slots=64)
        store: Any = SharedStore(tmp_path / "buckets")
        other: Any = SharedStore(tmp_path / "buckets")  # a second worker mapping the same file
    else:
        store = other = MemoryStore()
    a, b = bucket_key("t", "p1"), bucket_key("t", "p2")
    assert [store.take(a, limit, 5.0), other.take(a, limit, 5.0)] == [None, None]
    assert other.take(a, limit, 5.0) == 1000 and store.take(a, limit, 5.0) == 1000
    assert store.take(b, limit, 5.0) is None
    # a key whose bucket is full again frees its slot: a new bucket is just as full
    assert store.take(a, limit, 5.0 + 2000.0) is None


def test_a_full_shared_table_admits_and_counts(tmp_path: Any) -> None:
    create_shared_store(tmp_path / "buckets", slots=4)
    overflows: list[int] = []
    store = SharedStore(tmp_path / "buckets", on_overflow=lambda: overflows.append(1))
    limit = Limit(rate=0.001, burst=1.0)
    answers = [store.take(bucket_key("t", f"p{n}"), limit, 1.0) for n in range(6)]
    assert answers == [None] * 6 and len(overflows) == 2  # 4 slots held by live buckets, 2 unchecked


def test_overrides_inline_or_from_a_file(tmp_path: Any) -> None:
    assert parse_overrides(None) == {}
    assert parse_overrides('{"a": {"per_second": 1, "burst": 2}}') == {"a": Limit(1.0, 2.0)}
    path = tmp_path / "limits.json"
    path.write_text('{"b": {"per_second": 0.5, "burst": 1}}')
    assert parse_overrides(str(path)) == {"b": Limit(0.5, 1.0)}
    for bad in ('{"a": 1}', '{"a": {"rate": 1}}', '{"a": {"per_second": -1}}', "[]"):
        with pytest.raises(ValueError):
            parse_overrides(bad)
