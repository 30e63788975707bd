"""The reconciler list (docs/api.md section 7): filters, effective status, validation, stable keyset pages."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from support.ledger import (
    RECONCILER,
    Seed,
    committed,
    expire_lease,
    get,
    not_applied,
    owner,
    pending,
    seed,
    submitted,
    unknown,
)

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


async def list_ids(client: httpx.AsyncClient, **params: Any) -> list[str]:
    r = await get(client, "/v1/operations", params, **RECONCILER)
    assert r.status_code == 200, r.text
    assert r.json()["next_cursor"] is None
    return [item["operation_id"] for item in r.json()["items"]]


async def all_pages(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = await get(
            client, "/v1/operations", {**params, **({"cursor": cursor} if cursor else {})}, **RECONCILER
        )
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return items


async def test_filters_report_the_effective_status(client: httpx.AsyncClient, db_url: str) -> None:
    await pending(client, "a-pending")
    await submitted(client, "b-live")
    await submitted(client, "c-expired")
    await expire_lease(db_url, "c-expired")
    await unknown(client, "d-unknown")
    await committed(client, "e-committed")
    await not_applied(client, "f-not-applied")
    await pending(client, "g-other-tool", tool="probe")
    await pending(client, "other-tenant", tenant="t2")

    everything = [
        "a-pending",
        "b-live",
        "c-expired",
        "d-unknown",
        "e-committed",
        "f-not-applied",
        "g-other-tool",
    ]
    assert await list_ids(client) == everything
    assert await list_ids(client, status="unknown") == ["c-expired", "d-unknown"]
    assert await list_ids(client, status="submitted") == ["b-live"]
    assert await list_ids(client, status="pending") == ["a-pending", "g-other-tool"]
    assert await list_ids(client, status="committed") == ["e-committed"]
    assert await list_ids(client, status="not_applied") == ["f-not-applied"]
    assert await list_ids(client, tool="probe") == ["g-other-tool"]
    assert await list_ids(client, status="pending", tool="measure") == ["a-pending"]
    # docs/api.md writes the parameters out empty: an empty value is an absent one
    assert await list_ids(client, status="", tool="", updated_before="", limit="", cursor="") == everything

    r = await get(client, "/v1/operations", {"status": "unknown"}, **RECONCILER)
    expired = r.json()["items"][0]
    assert expired["status"] == "unknown" and expired["lease_expired"] is True
    assert set(expired) == set(r.json()["items"][1])
    # every read's view carries log_index (API.md 14), null for what is not a logged receipt
    assert [item["log_index"] for item in r.json()["items"]] == [None, None]

    async with owner(db_url) as conn:
        await conn.execute(
            "UPDATE ledger.operations SET updated_at = now() - interval '1 hour'"
            " WHERE operation_id IN ('a-pending', 'e-committed')"
        )
    cutoff = (datetime.now(UTC) - timedelta(minutes=30)).isoformat()
    assert await list_ids(client, updated_before=cutoff) == ["a-pending", "e-committed"]
    assert await list_ids(client, updated_before=cutoff, status="committed") == ["e-committed"]


async def test_list_is_tenant_scoped_and_needs_reconcile_or_audit(client: httpx.AsyncClient) -> None:
    await pending(client, "mine")
    r = await get(client, "/v1/operations", tenant="t2", sub="rec-2", scope="ledger:reconcile")
    assert r.status_code == 200 and r.json() == {"items": [], "next_cursor": None}
    assert (await get(client, "/v1/operations", sub="aud-1", scope="ledger:audit")).status_code == 200
    r = await get(client, "/v1/operations", scope="ledger:execute")
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = await client.get("/v1/operations")
    assert r.status_code == 401


async def test_bad_query_values_are_422_naming_each_field(client: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, str], list[str]]] = [
        ({"status": "lost"}, ["status"]),
        ({"limit": "0"}, ["limit"]),
        ({"limit": "501"}, ["limit"]),
        ({"limit": "ten"}, ["limit"]),
        ({"limit": "-1"}, ["limit"]),
        ({"updated_before": "yesterday"}, ["updated_before"]),
        ({"updated_before": "2026-11-30T10:00:00"}, ["updated_before"]),  # no offset
        ({"cursor": "not-a-cursor"}, ["cursor"]),
        ({"statsu": "unknown"}, ["statsu"]),
        ({"status": "lost", "limit": "0", "cursor": "@@"}, ["status", "limit", "cursor"]),
    ]
    for params, fields in cases:
        r = await get(client, "/v1/operations", params, **RECONCILER)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["code"] == "validation_failed"
        assert [e["field"] for e in r.json()["errors"]] == fields, (params, r.json())
    assert (await get(client, "/v1/operations", {"limit": "500"}, **RECONCILER)).status_code == 200
    # a cursor of another list is not a cursor of this one
    await committed(client, "c-1")
    await committed(client, "c-2")
    r = await get(client, "/v1/receipts", {"limit": "1"}, sub="aud-1", scope="ledger:audit")
    receipts_cursor = r.json()["next_cursor"]
    assert receipts_cursor is not None
    r = await get(client, "/v1/operations", {"cursor": receipts_cursor}, **RECONCILER)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "cursor"


def seeds(
    tenant: str, prefix: str, n: int, start: datetime, status: str = "pending", lease: datetime | None = None
) -> list[Seed]:
    # three operations share each millisecond, so the operation_id half of the key breaks ties
    return [
        Seed(tenant, f"{prefix}-{i:05d}", status, start + timedelta(milliseconds=i // 3), lease)
        for i in range(n)
    ]


async def test_pages_return_each_of_1000_exactly_once_while_rows_change(service: Any, db_url: str) -> None:
    start = datetime(2026, 11, 1, tzinfo=UTC)
    async with owner(db_url) as conn:
        await seed(conn, seeds("t1", "seed", 1000, start))
        await seed(conn, seeds("t2", "seed", 50, start))
    stop = asyncio.Event()

    async def churn() -> int:
        """Insert new operations (some keyed inside the range being paged) and change old ones."""
        rng = random.Random(7)
        n = 0
        async with service.client() as http, owner(db_url) as conn:
            while not stop.is_set():
                n += 1
                await pending(http, f"new-{n:05d}")
                inside = start + timedelta(milliseconds=rng.randrange(0, 400))
                await seed(conn, [Seed("t1", f"late-{n:05d}", "pending", inside)])
                await conn.execute(
                    "UPDATE ledger.operations SET status = 'submitted', updated_at = now(),"
                    " lease_expires_at = now() + interval '1 minute'"
                    " WHERE tenant_id = 't1' AND operation_id = $1",
                    f"seed-{rng.randrange(1000):05d}",
                )
        return n

    inserter = asyncio.create_task(churn())
    try:
        async with service.client() as http:
            seen: list[str] = []
            keys: list[tuple[str, str]] = []
            cursor = None
            pages = 0
            while True:
                params = {"limit": "37", **({"cursor": cursor} if cursor else {})}
                r = await get(http, "/v1/operations", params, **RECONCILER)
                assert r.status_code == 200, r.text
                pages += 1
                items = r.json()["items"]
                seen += [item["operation_id"] for item in items]
                keys += [(item["created_at"], item["operation_id"]) for item in items]
                cursor = r.json()["next_cursor"]
                if cursor is None:
                    break
                await asyncio.sleep(0.005)  # let the writer in between pages
    finally:
        stop.set()
        inserted = await inserter
    assert inserted > 0 and pages > 1000 // 37
    assert len(seen) == len(set(seen)), "an operation appeared twice"
    seeded = [s for s in seen if s.startswith("seed-")]
    assert sorted(seeded) == [f"seed-{i:05d}" for i in range(1000)]
    assert [k[0] for k in keys] == sorted(k[0] for k in keys), "pages are not oldest first"


async def test_unknown_pages_cover_stored_unknown_and_expired_submitted(
    client: httpx.AsyncClient, db_url: str
) -> None:
    start = datetime(2026, 11, 2, tzinfo=UTC)
    past, future = datetime(2026, 11, 3, tzinfo=UTC), datetime.now(UTC) + timedelta(hours=1)
    async with owner(db_url) as conn:
        # interleaved in creation order: unknown, expired submitted, live submitted, committed
        rows: list[Seed] = []
        for i in range(400):
            kind = ("unknown", "expired", "live", "committed")[i % 4]
            status = "submitted" if kind in ("expired", "live") else kind
            lease = past if kind == "expired" else future if kind == "live" else None
            rows.append(Seed("t1", f"{kind}-{i:04d}", status, start + timedelta(milliseconds=i // 2), lease))
        await seed(conn, rows)
    items = await all_pages(client, status="unknown", limit="45")
    ids = [item["operation_id"] for item in items]
    assert len(ids) == len(set(ids)) == 200
    assert {i.split("-")[0] for i in ids} == {"unknown", "expired"}
    assert all(item["status"] == "unknown" for item in items)
    assert all(item["lease_expired"] for item in items if item["operation_id"].startswith("expired"))
    live = await all_pages(client, status="submitted", limit="45")
    assert len(live) == 100 and all(item["status"] == "submitted" for item in live)
