"""Every row of the claim table of docs/api.md section 6, over real HTTP on real PostgreSQL."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import httpx
import pytest

from effect_ledger.domain.canonical import intent_digest
from effect_ledger.settings import Settings
from support.auth import auth
from support.ledger import CLAIM, VIEW_KEYS, claim, expire_lease
from support.ledger import call as post
from support.ledger import count_events as event_count


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The races here send 1,000 claims of one principal in a burst; the rate limit is not under test
    (tests/integration/test_rate_limits.py is where it is), so it is off for this module. Nor is load
    shedding (tests/integration/test_load_shedding.py): on a loaded machine 50 claims queued for 20
    connections waited past the 1 s shed bound and 12 of them got 503s, so the bounds are far away."""
    return replace(
        settings, rate_limit_per_second=0, pool_shed_wait_ms=60_000, pool_acquire_timeout_ms=60_000
    )


# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


async def test_new_id_is_granted_with_location_and_token(client: httpx.AsyncClient) -> None:
    r = await claim(client, "op-1")
    assert r.status_code == 201
    assert r.headers["location"] == "/v1/operations/op-1"
    body = r.json()
    assert body["action"] == "execute"
    assert body["claim"]["attempt"] == 1
    assert body["claim"]["token"].startswith("clt_") and len(body["claim"]["token"]) >= 26
    op = body["operation"]
    assert op["status"] == "pending" and op["attempt"] == 1 and op["principal"] == "exec-1"
    assert op["intent_digest"] == intent_digest(CLAIM["intent"])
    assert op["lease_expires_at"] == body["claim"]["lease_expires_at"]
    assert op["lease_expired"] is False and op["receipt"] is None
    assert set(op) == VIEW_KEYS


async def test_binding_mismatch_is_422_before_anything_else(client: httpx.AsyncClient) -> None:
    assert (await claim(client, "op-b")).status_code == 201
    other = {**CLAIM, "tool_version": "2.2.0", "intent": {"sensor": "s-2"}}
    r = await claim(client, "op-b", other)
    assert r.status_code == 422
    assert r.json()["code"] == "intent_conflict"
    assert r.json()["mismatched"] == ["tool_version", "intent_digest"]
    r = await claim(client, "op-b", sub="exec-2")
    assert r.json()["mismatched"] == ["principal"]


async def test_live_lease_is_in_progress_with_retry_after(client: httpx.AsyncClient) -> None:
    await claim(client, "op-l")
    r = await claim(client, "op-l")
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "operation_in_progress"
    assert 1 <= int(r.headers["retry-after"]) <= 30
    assert r.json()["operation"]["status"] == "pending"


async def test_client_nonce_replays_a_lost_claim_answer(client: httpx.AsyncClient, db_url: str) -> None:
    body = {**CLAIM, "client_nonce": "nonce-0123456789abcdef"}
    first = await claim(client, "op-n", body)
    again = await claim(client, "op-n", body)
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["claim"] == first.json()["claim"]
    other_nonce = await claim(client, "op-n", {**body, "client_nonce": "another-nonce-0123456789"})
    assert other_nonce.status_code == 409
    assert await event_count(db_url) == 1


async def test_submitted_with_expired_lease_is_outcome_unknown(
    client: httpx.AsyncClient, db_url: str
) -> None:
    tok = (await claim(client, "op-u")).json()["claim"]["token"]
    assert (await post(client, "op-u", "submit", {"token": tok, "effect_ref": "r-1"})).status_code == 200
    await expire_lease(db_url, "op-u")
    r = await claim(client, "op-u")
    assert r.status_code == 409 and r.json()["code"] == "outcome_unknown"
    assert r.json()["operation"]["status"] == "unknown" and r.json()["operation"]["lease_expired"] is True
    view = (await client.get("/v1/operations/op-u", headers=auth())).json()
    assert view["status"] == "unknown" and view["lease_expired"] is True


async def test_reported_unknown_is_outcome_unknown(client: httpx.AsyncClient) -> None:
    tok = (await claim(client, "op-ru")).json()["claim"]["token"]
    await post(client, "op-ru", "submit", {"token": tok})
    r = await post(client, "op-ru", "complete", {"token": tok, "outcome": "unknown"})
    assert r.status_code == 200 and r.json()["status"] == "unknown"
    r = await claim(client, "op-ru")
    assert r.status_code == 409 and r.json()["code"] == "outcome_unknown"


async def test_pending_with_expired_lease_is_reclaimed_and_old_token_goes_stale(
    client: httpx.AsyncClient, db_url: str
) -> None:
    old = (await claim(client, "op-r")).json()["claim"]["token"]
    await expire_lease(db_url, "op-r")
    r = await claim(client, "op-r")
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 2
    new = r.json()["claim"]["token"]
    assert new != old
    stale = await post(client, "op-r", "submit", {"token": old})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_claim"
    assert stale.json()["operation"]["attempt"] == 2
    assert (await post(client, "op-r", "submit", {"token": new})).json()["status"] == "submitted"


async def test_not_applied_starts_a_new_attempt(client: httpx.AsyncClient) -> None:
    tok = (await claim(client, "op-na")).json()["claim"]["token"]
    reason = {"category": "rejected", "detail_code": "quota"}
    r = await post(client, "op-na", "complete", {"token": tok, "outcome": "not_applied", "reason": reason})
    assert r.status_code == 200 and r.json()["not_applied_reason"] == reason
    r = await claim(client, "op-na")
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 2
    assert r.json()["operation"]["not_applied_reason"] is None


async def test_committed_hands_back_the_receipt(client: httpx.AsyncClient, db_url: str) -> None:
    tok = (await claim(client, "op-c")).json()["claim"]["token"]
    await post(client, "op-c", "submit", {"token": tok, "effect_ref": "remote-19"})
    receipt = {"external_ref": "m-7", "result": {"value": 21.5}, "observed_at": "2026-11-30T10:00:00Z"}
    done = await post(client, "op-c", "complete", {"token": tok, "outcome": "committed", "receipt": receipt})
    assert done.status_code == 200
    r = await claim(client, "op-c")
    assert r.status_code == 200
    assert r.json()["action"] == "reuse_receipt"
    got = r.json()["operation"]["receipt"]
    assert got == {
        **receipt,
        "result_digest": None,
        "observed_at": "2026-11-30T10:00:00.000Z",
        "recorded_by": "exec-1",
        "recorded_at": got["recorded_at"],
    }
    assert r.json()["operation"]["resolved_by"] == "exec-1"
    before = await event_count(db_url)
    again = await post(client, "op-c", "complete", {"token": tok, "outcome": "committed", "receipt": receipt})
    assert again.status_code == 200 and again.json() == done.json()
    assert await event_count(db_url) == before


async def test_fifty_concurrent_claims_of_twenty_ids_give_exactly_one_201_each(service: Any) -> None:
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    async with service.client(limits=limits) as http:
        for n in range(20):
            answers = await asyncio.gather(*(claim(http, f"race-{n}") for _ in range(50)))
            codes = sorted(a.status_code for a in answers)
            assert codes.count(201) == 1, codes
            assert codes.count(409) == 49
            assert {a.json()["code"] for a in answers if a.status_code == 409} == {"operation_in_progress"}
