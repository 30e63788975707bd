"""API.md section 9a: retention never reopens an operation. A purge keeps a tombstone (binding, final
status and attempt, receipt digest, chain head) for TOMBSTONE_DAYS; every claim-table row that can
meet a terminal operation is tried against it, and a claim racing the purge of its ID never executes
twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from effect_ledger.client import LedgerClient, Receipt
from effect_ledger.db.maintenance import owner_connection, purge, purge_ledger_batch
from effect_ledger.domain.canonical import intent_digest
from effect_ledger.http.auth import ALL_SCOPES
from effect_ledger.settings import Settings, SettingsError
from support.auth import auth, token
from support.ledger import AUDITOR, CLAIM, REASON, RECEIPT, Seed, call, claim, committed, get, owner, seed
from support.server import Service

pytestmark = pytest.mark.storage  # the Citus lane of .ci/run runs it again on a cluster


async def backdate(db_url: str, days: int, *ops: str) -> None:
    async with owner(db_url) as conn:
        await conn.execute(
            "UPDATE ledger.operations SET updated_at = now() - make_interval(days => $1)"
            " WHERE operation_id = ANY($2::text[])",
            days,
            list(ops),
        )


async def not_applied_twice(client: httpx.AsyncClient, op: str) -> None:
    """A not_applied operation at attempt 2."""
    for _ in range(2):
        r = await claim(client, op)
        assert r.status_code == 201, r.text
        done = {"token": r.json()["claim"]["token"], "outcome": "not_applied", "reason": REASON}
        assert (await call(client, op, "complete", done)).status_code == 200


async def test_every_claim_row_against_a_tombstone(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    done = await committed(client, "t-committed")
    receipt_shown = done.json()["receipt"]
    token = (await get(client, "/v1/operations/t-committed/events", **AUDITOR)).json()["items"]
    assert len(token) == 2
    await not_applied_twice(client, "t-not-applied")
    await backdate(db_url, 31, "t-committed", "t-not-applied")
    result = await purge(settings)
    assert (result.counts["operations"], result.counts["events"], result.counts["tombstones_expired"]) == (
        2,
        6,
        0,
    )

    # committed, same binding -> 200 reuse_receipt, never executable again
    r = await claim(client, "t-committed")
    assert r.status_code == 200 and r.json()["action"] == "reuse_receipt"
    view = r.json()["operation"]
    assert view["status"] == "committed" and view["attempt"] == 1 and view["receipt"] is None
    assert view["purged"] is True and view["receipt_digest"] == intent_digest(receipt_shown)
    assert view["effect_ref"] is None and view["principal"] == "exec-1"
    # GET shows the same view (plus log_index, which reads look up: API.md section 14); an executor of
    # another principal still gets 404
    assert (await get(client, "/v1/operations/t-committed")).json() == {**view, "log_index": None}
    other = await get(client, "/v1/operations/t-committed", sub="exec-2", scope="ledger:execute")
    assert other.status_code == 404
    # binding differs -> 422 intent_conflict, checked first as ever
    r = await claim(client, "t-committed", {**CLAIM, "intent": {"sensor": "s-2"}})
    assert r.status_code == 422 and r.json()["mismatched"] == ["intent_digest"]
    r = await claim(client, "t-committed", sub="exec-2")
    assert r.status_code == 422 and r.json()["mismatched"] == ["principal"]
    r = await claim(client, "t-not-applied", {**CLAIM, "tool_version": "9"})
    assert r.status_code == 422 and r.json()["mismatched"] == ["tool_version"]
    # not_applied tombstone -> a new attempt, numbered after the tombstone's
    tomb = (await get(client, "/v1/operations/t-not-applied")).json()
    assert tomb["purged"] is True and tomb["receipt_digest"] is None and tomb["attempt"] == 2
    assert tomb["not_applied_reason"] is None and tomb["status"] == "not_applied"
    r = await claim(client, "t-not-applied")
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 3
    assert "purged" not in r.json()["operation"]
    # its chain continues from the purge point and still verifies; so does the tombstone's
    finish = {"token": r.json()["claim"]["token"], "outcome": "committed", "receipt": RECEIPT}
    assert (await call(client, "t-not-applied", "complete", finish)).status_code == 200
    events = (await get(client, "/v1/operations/t-not-applied/events", **AUDITOR)).json()["items"]
    assert [e["seq"] for e in events] == [5, 6]
    for op in ("t-committed", "t-not-applied"):
        verdict = (await get(client, "/v1/audit/verify", {"operation_id": op}, **AUDITOR)).json()
        assert verdict["ok"] is True, (op, verdict)
    assert (await get(client, "/v1/audit/verify", **AUDITOR)).json()["ok"] is True
    assert (await get(client, "/v1/operations/t-committed/events", **AUDITOR)).json() == {"items": []}
    # the feed shows no tombstone (it has no receipt to show); the reclaimed and committed one is on it
    feed = (await get(client, "/v1/receipts", **AUDITOR)).json()["items"]
    assert [i["operation_id"] for i in feed] == ["t-not-applied"]


async def test_late_reports_on_a_committed_tombstone(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    r = await claim(client, "t-late")
    token = r.json()["claim"]["token"]
    await call(client, "t-late", "complete", {"token": token, "outcome": "committed", "receipt": RECEIPT})
    await backdate(db_url, 31, "t-late")
    await purge(settings)
    # the same outcome again: 200, nothing changes (the receipt is gone, the outcome still agrees)
    again = await call(
        client, "t-late", "complete", {"token": token, "outcome": "committed", "receipt": RECEIPT}
    )
    assert again.status_code == 200 and again.json()["purged"] is True
    other = await call(
        client, "t-late", "complete", {"token": token, "outcome": "not_applied", "reason": REASON}
    )
    assert other.status_code == 409 and other.json()["code"] == "conflicting_outcome"
    unresolved = {"outcome": "unresolved", "evidence": {"source": "x", "checked_at": "2026-11-30T10:00:00Z"}}
    r = await call(client, "t-late", "resolve", unresolved, sub="rec-1", scope="ledger:reconcile")
    assert r.status_code == 200
    assert (await get(client, "/v1/audit/verify", {"operation_id": "t-late"}, **AUDITOR)).json()["ok"] is True


async def test_the_id_vanishes_only_after_tombstone_days(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await committed(client, "t-old")
    await backdate(db_url, 31, "t-old")
    await purge(settings)
    await backdate(db_url, 399, "t-old")
    assert (await purge(settings)).counts["tombstones_expired"] == 0
    assert (await claim(client, "t-old")).status_code == 200
    await backdate(db_url, 401, "t-old")
    assert (await purge(settings)).counts["tombstones_expired"] == 1
    assert (await get(client, "/v1/operations/t-old")).status_code == 404
    r = await claim(client, "t-old")
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 1
    # a shorter horizon, as configured
    await committed(client, "t-short")
    await backdate(db_url, 45, "t-short")
    short = await purge(replace(settings, retention_days=30, tombstone_days=40))
    assert (short.counts["operations"], short.counts["tombstones_expired"]) == (1, 1)


def test_tombstone_days_below_retention_days_is_refused() -> None:
    with pytest.raises(ValueError, match="TOMBSTONE_DAYS"):
        Settings(retention_days=30, tombstone_days=29)
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"EFFECT_LEDGER_RETENTION_DAYS": "500"})
    assert (
        "EFFECT_LEDGER_TOMBSTONE_DAYS (400) must not be less than EFFECT_LEDGER_RETENTION_DAYS (500)"
        in str(refused.value)
    )
    assert Settings.from_env({"EFFECT_LEDGER_RETENTION_DAYS": "500", "EFFECT_LEDGER_TOMBSTONE_DAYS": "500"})


ROUNDS = 200
SEEDED = {
    "tool": "measure",
    "tool_version": "1.0",
    "intent_digest": "sha256:" + "0" * 64,
    "lease_seconds": 60,
}


@pytest.fixture
async def unlimited_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a service with the rate limit off: the race's 800 claims of one principal come faster
    than the default limit (burst 400, 200/s) on a fast machine, and a 429 is not what it is about
    (test_rate_limits.py is)."""
    async with Service(replace(settings, rate_limit_per_second=0)) as running, running.client() as http:
        yield http


@pytest.mark.timeout(600)
async def test_a_claim_racing_the_purge_never_executes_twice(
    unlimited_client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    recent = datetime.now(UTC) - timedelta(hours=1)
    async with owner(db_url) as conn:
        await seed(
            conn,
            [Seed("t1", f"race-c-{n}", "committed", recent) for n in range(ROUNDS)]
            + [Seed("t1", f"race-n-{n}", "not_applied", recent) for n in range(ROUNDS)],
        )
    purger = await owner_connection(settings)
    answers: Counter[tuple[str, int, str]] = Counter()
    tombstoned = 0
    try:
        for n in range(ROUNDS):
            pair = (f"race-c-{n}", f"race-n-{n}")
            await backdate(db_url, 31, *pair)

            async def claim_seeded(op: str) -> httpx.Response:
                return await unlimited_client.post(f"/v1/operations/{op}/claim", json=SEEDED, headers=auth())

            purged, *claims = await asyncio.gather(
                purge_ledger_batch(purger, settings.retention_days, 10),
                claim_seeded(pair[0]),
                claim_seeded(pair[1]),
                claim_seeded(pair[0]),
                claim_seeded(pair[1]),
            )
            tombstoned += purged[0]
            committed_answers = [c for c in claims if c.request.url.path.endswith(f"{pair[0]}/claim")]
            other_answers = [c for c in claims if c not in committed_answers]
            for c in committed_answers:
                answers[("committed", c.status_code, c.json().get("action", c.json().get("code")))] += 1
                assert c.status_code == 200 and c.json()["action"] == "reuse_receipt", c.text
            granted = [c for c in other_answers if c.status_code == 201]
            assert len(granted) == 1, [c.text for c in other_answers]
            assert granted[0].json()["claim"]["attempt"] == 2
            for c in other_answers:
                answers[("not_applied", c.status_code, c.json().get("action", c.json().get("code")))] += 1
                assert c.status_code in (201, 409), c.text
    finally:
        await purger.close()
    assert answers[("committed", 200, "reuse_receipt")] == 2 * ROUNDS
    assert answers[("not_applied", 201, "execute")] == ROUNDS
    assert tombstoned >= 1  # the purge won some of the races (and the claim the others)
    async with owner(db_url) as conn:
        attempts = await conn.fetch(
            "SELECT attempt, status FROM ledger.operations WHERE operation_id LIKE 'race-n-%'"
        )
        assert {(r["attempt"], r["status"]) for r in attempts} == {(2, "pending")}
        left: Any = await conn.fetchval(
            "SELECT count(*) FROM ledger.operations WHERE operation_id LIKE 'race-c-%' AND status = 'committed'"
        )
        assert left == ROUNDS


async def test_the_python_client_reuses_a_purged_receipt_without_running(
    service: Service, db_url: str, settings: Settings
) -> None:
    tool = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}}
    async with LedgerClient(service.base_url, token(scope=" ".join(ALL_SCOPES))) as ledger:
        async with ledger.effect("t-client", **tool) as effect:
            await effect.submitted(effect_ref="req-1")
            effect.commit(Receipt(external_ref="m-1"))
        await backdate(db_url, 31, "t-client")
        await purge(settings)
        async with ledger.effect("t-client", **tool) as again:
            assert again.reused and again.claim is None and again.receipt is None
            assert again.operation is not None and again.operation.purged
            assert again.operation.receipt_digest is not None
        page = await ledger.receipts(after=None)
        assert page.items == []
