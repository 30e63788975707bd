"""Claim-and-submit (API.md section 6, `"submit"` in the claim body) for every row of the claim table:
a granted attempt is submitted in the same transaction; every other answer is unchanged and nothing
is submitted."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import httpx
import pytest

from effect_ledger.settings import Settings
from support.ledger import CLAIM, claim, events_of, expire_lease
from support.ledger import call as post
from support.ledger import count_events as event_count
from support.server import Service

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


SUBMIT = {**CLAIM, "submit": {"effect_ref": "remote-1"}}


def kinds(events: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None, int]]:
    return [(e["kind"], e["from_status"], e["to_status"], e["attempt"]) for e in events]


async def test_new_id_is_granted_submitted(client: httpx.AsyncClient, db_url: str) -> None:
    r = await claim(client, "op-1", SUBMIT)
    assert r.status_code == 201 and r.headers["location"] == "/v1/operations/op-1"
    body = r.json()
    assert body["action"] == "execute" and body["claim"]["attempt"] == 1
    op = body["operation"]
    assert (op["status"], op["effect_ref"], op["attempt"]) == ("submitted", "remote-1", 1)
    assert op["submitted_at"] == op["created_at"] == op["updated_at"]
    assert op["lease_expires_at"] == body["claim"]["lease_expires_at"]
    assert kinds(await events_of(db_url, "op-1")) == [
        ("claimed", None, "pending", 1),
        ("submitted", "pending", "submitted", 1),
    ]
    token = body["claim"]["token"]
    again = await post(client, "op-1", "submit", {"token": token, "effect_ref": "remote-1"})
    assert again.status_code == 200 and again.json() == op  # a repeated submit changes nothing
    done = await post(client, "op-1", "complete", {"token": token, "outcome": "unknown"})
    assert done.status_code == 200 and done.json()["status"] == "unknown"


async def test_null_effect_ref_is_submitted_without_one(client: httpx.AsyncClient) -> None:
    r = await claim(client, "op-0", {**CLAIM, "submit": {}})
    assert r.status_code == 201
    assert (r.json()["operation"]["status"], r.json()["operation"]["effect_ref"]) == ("submitted", None)


async def test_binding_mismatch_is_422_and_submits_nothing(client: httpx.AsyncClient, db_url: str) -> None:
    assert (await claim(client, "op-b")).status_code == 201
    r = await claim(client, "op-b", {**SUBMIT, "tool_version": "9"})
    assert r.status_code == 422 and r.json()["code"] == "intent_conflict"
    assert r.json()["mismatched"] == ["tool_version"]
    assert kinds(await events_of(db_url, "op-b")) == [("claimed", None, "pending", 1)]


async def test_live_lease_is_in_progress_and_submits_nothing(client: httpx.AsyncClient, db_url: str) -> None:
    await claim(client, "op-l")
    r = await claim(client, "op-l", SUBMIT)
    assert r.status_code == 409 and r.json()["code"] == "operation_in_progress"
    assert r.json()["operation"]["status"] == "pending" and 1 <= int(r.headers["retry-after"]) <= 30
    assert await event_count(db_url) == 1


async def test_a_lost_answer_is_replayed_as_it_was(client: httpx.AsyncClient, db_url: str) -> None:
    body = {**SUBMIT, "client_nonce": "nonce-0123456789abcdef"}
    first = await claim(client, "op-n", body)
    again = await claim(client, "op-n", body)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["claim"] == first.json()["claim"]
    assert again.json()["operation"]["status"] == "submitted"
    assert await event_count(db_url) == 2  # claimed + submitted, once
    # a claim without submit, replayed with submit: the answer is the claim, nothing is submitted
    plain = {**CLAIM, "client_nonce": "nonce-fedcba9876543210"}
    await claim(client, "op-m", plain)
    replay = await claim(client, "op-m", {**plain, "submit": {"effect_ref": "late"}})
    assert replay.status_code == 201 and replay.json()["operation"]["status"] == "pending"
    assert kinds(await events_of(db_url, "op-m")) == [("claimed", None, "pending", 1)]


async def test_unknown_outcomes_are_refused_and_submit_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    assert (await claim(client, "op-u", SUBMIT)).status_code == 201
    await expire_lease(db_url, "op-u")
    r = await claim(client, "op-u", SUBMIT)
    assert r.status_code == 409 and r.json()["code"] == "outcome_unknown"
    assert await event_count(db_url) == 2
    token = (await claim(client, "op-ru", SUBMIT)).json()["claim"]["token"]
    await post(client, "op-ru", "complete", {"token": token, "outcome": "unknown"})
    r = await claim(client, "op-ru", SUBMIT)
    assert r.status_code == 409 and r.json()["code"] == "outcome_unknown"


async def test_expired_pending_is_reclaimed_submitted(client: httpx.AsyncClient, db_url: str) -> None:
    old = (await claim(client, "op-r")).json()["claim"]["token"]
    await expire_lease(db_url, "op-r")
    r = await claim(client, "op-r", SUBMIT)
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 2
    assert (r.json()["operation"]["status"], r.json()["operation"]["effect_ref"]) == ("submitted", "remote-1")
    assert kinds(await events_of(db_url, "op-r"))[1:] == [
        ("reclaimed", "pending", "pending", 2),
        ("submitted", "pending", "submitted", 2),
    ]
    stale = await post(client, "op-r", "submit", {"token": old})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_claim"


async def test_not_applied_starts_a_new_attempt_submitted(client: httpx.AsyncClient, db_url: str) -> None:
    tok = (await claim(client, "op-na")).json()["claim"]["token"]
    reason = {"category": "rejected", "detail_code": "quota"}
    await post(client, "op-na", "complete", {"token": tok, "outcome": "not_applied", "reason": reason})
    r = await claim(client, "op-na", SUBMIT)
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 2
    view = r.json()["operation"]
    assert (view["status"], view["not_applied_reason"], view["effect_ref"]) == ("submitted", None, "remote-1")
    assert kinds(await events_of(db_url, "op-na"))[-2:] == [
        ("reclaimed", "not_applied", "pending", 2),
        ("submitted", "pending", "submitted", 2),
    ]


async def test_committed_hands_back_the_receipt_and_submits_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    tok = (await claim(client, "op-c", SUBMIT)).json()["claim"]["token"]
    done = await post(
        client, "op-c", "complete", {"token": tok, "outcome": "committed", "receipt": {"external_ref": "m-7"}}
    )
    assert done.status_code == 200
    before = await event_count(db_url)
    r = await claim(client, "op-c", SUBMIT)
    assert r.status_code == 200 and r.json()["action"] == "reuse_receipt"
    assert r.json()["operation"]["status"] == "committed"
    assert await event_count(db_url) == before


async def test_submit_member_is_decoded_strictly(client: httpx.AsyncClient) -> None:
    for bad, field in (
        ({"effect_ref": 7}, "submit.effect_ref"),
        ({"ref": "x"}, "submit.ref"),
        ("yes", "submit"),
        ({"effect_ref": "x" * 257}, "submit.effect_ref"),
    ):
        r = await claim(client, "op-bad", {**CLAIM, "submit": bad})
        assert r.status_code == 422 and r.json()["code"] == "validation_failed", r.text
        assert r.json()["errors"][0]["field"] == field


async def test_fifty_concurrent_claims_with_submit_give_exactly_one_201(
    settings: Settings, db_url: str
) -> None:
    # patient admission: on a machine this busy (CI, two lanes at once) the queue's oldest claim waited
    # over POOL_SHED_WAIT_MS and later ones were shed with 503 (tests/integration/test_load_shedding.py
    # covers that); this test is about the race, so every claim is let through to it
    patient = replace(settings, pool_shed_wait_ms=30_000, pool_acquire_timeout_ms=30_000)
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    async with Service(patient) as service, service.client(limits=limits) as http:
        answers = await asyncio.gather(*(claim(http, "race", SUBMIT) for _ in range(50)))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(201) == 1 and codes.count(409) == 49, codes
    assert kinds(await events_of(db_url, "race")) == [
        ("claimed", None, "pending", 1),
        ("submitted", "pending", "submitted", 1),
    ]
