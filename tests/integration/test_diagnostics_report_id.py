"""API.md section 9: a report with a `report_id` is stored once per principal; a repeat answers the
first incident (200, Idempotent-Replayed), different fields under the same ID answer 409
conflicting_outcome. The runtime role still cannot read incidents."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from typing import Any

import asyncpg
import httpx
import pytest

from support.auth import auth
from support.database import runtime_connection
from support.ledger import submitted

pytestmark = pytest.mark.storage  # the Citus lane of .ci/run runs it again on a cluster

WRITE = "diagnostics:write"
REPORT_ID = "rep-2026-11-30-000001"
BODY = {
    "phase": "first_byte",
    "cause": "timeout",
    "elapsed_ms": 30000,
    "headers": {"Retry-After": "3"},
    "report_id": REPORT_ID,
}


async def report(client: httpx.AsyncClient, body: dict[str, Any], **who: str) -> httpx.Response:
    return await client.post("/v1/diagnostics", json=body, headers=auth(scope=WRITE, **who))


async def stored(db_url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetch(
            "SELECT tenant_id, principal, incident_id, report_key FROM diagnostics.incidents"
            " ORDER BY created_at"
        )
    finally:
        await conn.close()


async def test_a_repeat_answers_the_first_incident_and_stores_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    first = await report(client, BODY)
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    # the same report again, headers spelt differently (names are case-insensitive) and keys reordered
    again = await report(client, {**dict(reversed(BODY.items())), "headers": {"retry-after": "3"}})
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    rows = await stored(db_url)
    assert len(rows) == 1 and rows[0]["incident_id"] == first.json()["incident"]
    # the report_id itself is never stored, only its SHA-256
    assert bytes(rows[0]["report_key"]) == hashlib.sha256(REPORT_ID.encode()).digest()


@pytest.mark.parametrize(
    "change", [{"cause": "upstream"}, {"elapsed_ms": 30001}, {"headers": None}, {"provider": "example-llm"}]
)
async def test_different_fields_under_the_same_id_are_409(
    client: httpx.AsyncClient, db_url: str, change: dict[str, Any]
) -> None:
    first = await report(client, BODY)
    assert first.status_code == 201
    r = await report(client, {**BODY, **change})
    assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"
    assert REPORT_ID not in r.text and "incident" not in r.json()
    assert len(await stored(db_url)) == 1


async def test_the_id_is_scoped_to_the_principal_and_tenant(client: httpx.AsyncClient, db_url: str) -> None:
    answers = [
        await report(client, BODY, **who)
        for who in ({"sub": "exec-1"}, {"sub": "exec-2"}, {"tenant": "t2", "sub": "exec-1"})
    ]
    assert [a.status_code for a in answers] == [201, 201, 201]
    assert len({a.json()["incident"] for a in answers}) == 3
    assert len(await stored(db_url)) == 3
    # without a report_id nothing is deduplicated
    plain = {k: v for k, v in BODY.items() if k != "report_id"}
    assert [(await report(client, plain)).status_code for _ in range(2)] == [201, 201]


async def test_concurrent_repeats_store_exactly_one(client: httpx.AsyncClient, db_url: str) -> None:
    for round_no in range(5):
        body = {**BODY, "report_id": f"{REPORT_ID}-{round_no}"}
        answers = await asyncio.gather(*(report(client, body) for _ in range(12)))
        statuses = Counter(a.status_code for a in answers)
        assert statuses == {201: 1, 200: 11}
        assert len({a.json()["incident"] for a in answers}) == 1
        assert all(a.headers.get("idempotent-replayed") == "true" for a in answers if a.status_code == 200)
    assert len(await stored(db_url)) == 5


async def test_concurrent_different_reports_under_one_id(client: httpx.AsyncClient, db_url: str) -> None:
    bodies = [{**BODY, "elapsed_ms": 1000 + (i % 2)} for i in range(12)]
    answers = await asyncio.gather(*(report(client, b) for b in bodies))
    winner = next(i for i, a in enumerate(answers) if a.status_code == 201)
    for body, answer in zip(bodies, answers, strict=True):
        if answer.status_code == 201:
            continue
        expected = 200 if body == bodies[winner] else 409
        assert answer.status_code == expected, answer.text
    assert sum(a.status_code == 201 for a in answers) == 1
    assert len(await stored(db_url)) == 1


@pytest.mark.parametrize("report_id", ["x" * 15, "x" * 129, 12345678901234567, ""])
async def test_report_id_bounds(client: httpx.AsyncClient, report_id: Any) -> None:
    r = await report(client, {**BODY, "report_id": report_id})
    assert r.status_code == 422 and r.json()["code"] == "validation_failed"
    assert r.json()["errors"][0]["field"] == "report_id"
    for ok in ("y" * 16, "z" * 128):
        assert (await report(client, {**BODY, "report_id": ok})).status_code == 201


async def test_complete_diagnostics_take_no_report_id(client: httpx.AsyncClient) -> None:
    token = await submitted(client, "op-d")
    body = {"token": token, "outcome": "unknown", "diagnostics": {"cause": "timeout", "report_id": REPORT_ID}}
    r = await client.post("/v1/operations/op-d/complete", json=body, headers=auth())
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "diagnostics.report_id"


async def test_the_store_function_reveals_only_a_reference_within_the_tenant(
    client: httpx.AsyncClient, db_url: str
) -> None:
    first = (await report(client, BODY)).json()["incident"]
    key = hashlib.sha256(REPORT_ID.encode()).digest()
    call = (
        "SELECT * FROM diagnostics.store_report('inc_' || $1, 'exec-1', $2, $3,"
        " NULL, NULL, NULL, 'timeout', NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    conn = await runtime_connection(db_url)
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('effect_ledger.tenant', 't1', true),"
                " set_config('effect_ledger.maintenance', 'on', true)"
            )
            rows = await conn.fetch(call, "a" * 20, key, b"\0" * 32)
            assert [tuple(r) for r in rows] == [(first, False, False)]
        # in another tenant the same key is a new report of that tenant, maintenance scope or not
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('effect_ledger.tenant', 't2', true),"
                " set_config('effect_ledger.maintenance', 'on', true)"
            )
            rows = await conn.fetch(call, "b" * 20, key, b"\0" * 32)
            assert [tuple(r) for r in rows] == [("inc_" + "b" * 20, True, True)]
        # and the table itself stays unreadable
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch("SELECT report_fingerprint FROM diagnostics.incidents")
    finally:
        await conn.close()
    rows = await stored(db_url)
    assert [(r["tenant_id"], r["incident_id"]) for r in rows] == [("t1", first), ("t2", "inc_" + "b" * 20)]
