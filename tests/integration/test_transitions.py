"""Fenced transitions: submit, heartbeat, complete; idempotent repeats; conflicts; races (docs/api.md §6)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from support.auth import auth
from support.ledger import call as post
from support.ledger import claim, expire_lease
from support.ledger import count_events as event_count

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage

RECEIPT = {"external_ref": "ext-1", "result_digest": "sha256:" + "0f" * 32}
REASON = {"category": "rejected", "detail_code": "insufficient_funds"}


async def granted(client: httpx.AsyncClient, op: str, **body: Any) -> str:
    r = await claim(client, op, {"tool": "charge", "tool_version": "1", "intent": {"amount": 5}, **body})
    assert r.status_code == 201, r.text
    return str(r.json()["claim"]["token"])


async def lease_of(db_url: str, op: str) -> Any:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval(
            "SELECT lease_expires_at FROM ledger.operations WHERE operation_id = $1", op
        )
    finally:
        await conn.close()


async def test_every_repeat_is_answered_the_same_and_changes_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    tok = await granted(client, "op-rep")
    s1 = await post(client, "op-rep", "submit", {"token": tok, "effect_ref": "r-1"})
    count = await event_count(db_url)
    s2 = await post(client, "op-rep", "submit", {"token": tok, "effect_ref": "r-1"})
    assert s1.status_code == s2.status_code == 200 and s1.json() == s2.json()
    assert await event_count(db_url) == count
    c1 = await post(client, "op-rep", "complete", {"token": tok, "outcome": "committed", "receipt": RECEIPT})
    count = await event_count(db_url)
    for _ in range(3):
        c2 = await post(
            client, "op-rep", "complete", {"token": tok, "outcome": "committed", "receipt": RECEIPT}
        )
        assert c2.status_code == 200 and c2.json() == c1.json()
    assert await event_count(db_url) == count


async def test_submit_with_another_effect_ref_is_refused(client: httpx.AsyncClient) -> None:
    tok = await granted(client, "op-ref")
    await post(client, "op-ref", "submit", {"token": tok, "effect_ref": "r-1"})
    r = await post(client, "op-ref", "submit", {"token": tok, "effect_ref": "r-2"})
    assert r.status_code == 409 and r.json()["code"] == "invalid_transition"


async def test_a_different_second_report_is_conflicting_and_recorded(
    client: httpx.AsyncClient, db_url: str
) -> None:
    tok = await granted(client, "op-conf")
    await post(client, "op-conf", "submit", {"token": tok})
    await post(client, "op-conf", "complete", {"token": tok, "outcome": "committed", "receipt": RECEIPT})
    count = await event_count(db_url)
    other = {**RECEIPT, "external_ref": "ext-2"}
    r = await post(client, "op-conf", "complete", {"token": tok, "outcome": "committed", "receipt": other})
    assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"
    assert r.json()["operation"]["receipt"]["external_ref"] == "ext-1"
    r = await post(client, "op-conf", "complete", {"token": tok, "outcome": "not_applied", "reason": REASON})
    assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"
    assert await event_count(db_url) == count + 2
    events = (await client.get("/v1/operations/op-conf/events", headers=auth())).json()["items"]
    assert [e["kind"] for e in events][-2:] == ["discrepancy", "discrepancy"]
    assert events[-2]["data"]["reported_receipt"]["external_ref"] == "ext-2"


FULL_RECEIPT = {
    "external_ref": "ext-1",
    "result_digest": "sha256:" + "0f" * 32,
    "result": {"rows": [1, 2], "ok": True},
    "observed_at": "2026-12-01T10:00:00Z",
}
CHANGED = {
    "external_ref": "ext-2",
    "result_digest": "sha256:" + "1e" * 32,
    "result": {"rows": [1, 2], "ok": False},
    "observed_at": "2026-12-01T10:00:01Z",
}


@pytest.mark.parametrize("member", sorted(CHANGED))
async def test_a_repeated_report_is_compared_member_by_member(client: httpx.AsyncClient, member: str) -> None:
    """ledger.same_outcome: the same receipt again is `unchanged` (200, the same view), one content
    member changed is a conflicting outcome (each compared alone since migration 0022), and a
    member left out where the first had it changes it too."""
    op = f"op-same-{member}"
    tok = await granted(client, op)
    first = await post(
        client, op, "complete", {"token": tok, "outcome": "committed", "receipt": FULL_RECEIPT}
    )
    assert first.status_code == 200, first.text
    again = await post(
        client, op, "complete", {"token": tok, "outcome": "committed", "receipt": FULL_RECEIPT}
    )
    assert again.status_code == 200 and again.json() == first.json()
    changed = {**FULL_RECEIPT, member: CHANGED[member]}
    r = await post(client, op, "complete", {"token": tok, "outcome": "committed", "receipt": changed})
    assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"
    left_out = {k: v for k, v in FULL_RECEIPT.items() if k != member}
    r = await post(client, op, "complete", {"token": tok, "outcome": "committed", "receipt": left_out})
    assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"


async def test_outcome_rules(client: httpx.AsyncClient) -> None:
    tok = await granted(client, "op-rules")
    r = await post(client, "op-rules", "complete", {"token": tok, "outcome": "unknown"})
    assert r.status_code == 409 and r.json()["code"] == "invalid_transition"  # unknown only from submitted
    r = await post(client, "op-rules", "complete", {"token": tok, "outcome": "committed"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "receipt"
    r = await post(client, "op-rules", "complete", {"token": tok, "outcome": "committed", "receipt": {}})
    assert r.status_code == 422
    r = await post(client, "op-rules", "complete", {"token": tok, "outcome": "not_applied"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "reason"
    # committed straight from pending is allowed (the effect was synchronous and verified)
    r = await post(client, "op-rules", "complete", {"token": tok, "outcome": "committed", "receipt": RECEIPT})
    assert r.status_code == 200 and r.json()["status"] == "committed"
    assert r.json()["lease_expires_at"] is None and r.json()["resolved_by"] == "exec-1"


async def test_late_report_from_unknown_by_the_current_claimant(
    client: httpx.AsyncClient, db_url: str
) -> None:
    tok = await granted(client, "op-late")
    await post(client, "op-late", "submit", {"token": tok})
    await expire_lease(db_url, "op-late")
    r = await post(client, "op-late", "heartbeat", {"token": tok, "lease_seconds": 30})
    assert (
        r.status_code == 409 and r.json()["code"] == "outcome_unknown"
    )  # an expired submit cannot be revived
    r = await post(client, "op-late", "complete", {"token": tok, "outcome": "committed", "receipt": RECEIPT})
    assert r.status_code == 200 and r.json()["status"] == "committed"
    kinds = [
        e["kind"] for e in (await client.get("/v1/operations/op-late/events", headers=auth())).json()["items"]
    ]
    assert kinds == ["claimed", "submitted", "lease_expired", "completed"]


async def test_heartbeat_extends_the_lease_from_the_database_clock(
    client: httpx.AsyncClient, db_url: str
) -> None:
    tok = await granted(client, "op-hb", lease_seconds=5)
    before = await lease_of(db_url, "op-hb")
    r = await post(client, "op-hb", "heartbeat", {"token": tok, "lease_seconds": 600})
    assert r.status_code == 200
    after = await lease_of(db_url, "op-hb")
    assert 590 < (after - before).total_seconds() < 600
    assert r.json()["lease_expires_at"].startswith(after.strftime("%Y-%m-%dT%H:%M:%S"))


async def test_heartbeat_and_reclaim_race_has_one_winner(service: Any, db_url: str) -> None:
    """After the lease expires, a heartbeat and a reclaim race: exactly one of them takes effect."""
    outcomes = {"heartbeat": 0, "reclaim": 0}
    async with service.client() as http:
        for n in range(20):
            op = f"op-race-{n}"
            tok = await granted(http, op)
            await expire_lease(db_url, op)
            hb, rc = await asyncio.gather(
                post(http, op, "heartbeat", {"token": tok, "lease_seconds": 60}),
                claim(http, op, {"tool": "charge", "tool_version": "1", "intent": {"amount": 5}}),
            )
            if hb.status_code == 200:
                assert rc.status_code == 409 and rc.json()["code"] == "operation_in_progress"
                outcomes["heartbeat"] += 1
            else:
                assert hb.status_code == 409 and hb.json()["code"] == "stale_claim"
                assert rc.status_code == 201 and rc.json()["claim"]["attempt"] == 2
                outcomes["reclaim"] += 1
            view = (await http.get(f"/v1/operations/{op}", headers=auth())).json()
            assert view["attempt"] == (1 if hb.status_code == 200 else 2)
            assert view["lease_expired"] is False
    assert sum(outcomes.values()) == 20


async def test_stale_token_is_refused_for_every_transition(client: httpx.AsyncClient, db_url: str) -> None:
    old = await granted(client, "op-stale")
    await expire_lease(db_url, "op-stale")
    await granted(client, "op-stale")
    for call, body in (
        ("submit", {}),
        ("heartbeat", {"lease_seconds": 5}),
        ("complete", {"outcome": "not_applied", "reason": REASON}),
    ):
        r = await post(client, "op-stale", call, {"token": old, **body})
        assert r.status_code == 409 and r.json()["code"] == "stale_claim", call
    assert (await post(client, "op-stale", "submit", {"token": "clt_forged"})).json()["code"] == "stale_claim"
