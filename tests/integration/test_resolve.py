"""Resolve (docs/api.md section 7) over real HTTP on real PostgreSQL: outcomes, repeats, conflicts, races."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from support.auth import auth
from support.ledger import (
    EVIDENCE,
    REASON,
    RECEIPT,
    call,
    claim,
    count_events,
    events_of,
    expire_lease,
    pending,
    resolve,
    stored_status,
    submitted,
    unknown,
)

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage

NORMALISED_EVIDENCE = {**EVIDENCE, "checked_at": "2026-11-30T10:00:00.000Z"}


async def test_unknown_resolved_as_committed_records_who_and_evidence(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await unknown(client, "op-1")
    r = await resolve(client, "op-1", "committed", receipt=RECEIPT)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["status"] == "committed" and view["resolved_by"] == "rec-1"
    assert view["receipt"]["external_ref"] == "m-7" and view["receipt"]["recorded_by"] == "rec-1"
    assert view["resolved_at"] == view["receipt"]["recorded_at"] == view["updated_at"]
    last = (await events_of(db_url, "op-1"))[-1]
    assert (last["kind"], last["actor"], last["from_status"], last["to_status"]) == (
        "resolved",
        "rec-1",
        "unknown",
        "committed",
    )
    assert last["data"]["evidence"] == NORMALISED_EVIDENCE
    again = await claim(client, "op-1")
    assert again.status_code == 200 and again.json()["action"] == "reuse_receipt"


async def test_expired_submitted_resolved_as_not_applied_can_be_claimed_again(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await submitted(client, "op-2")
    await expire_lease(db_url, "op-2")
    assert await stored_status(db_url, "op-2") == "submitted"  # not swept: still unknown in effect
    r = await resolve(client, "op-2", "not_applied", reason=REASON)
    assert r.status_code == 200 and r.json()["status"] == "not_applied"
    assert r.json()["not_applied_reason"] == REASON and r.json()["lease_expires_at"] is None
    kinds = [
        (e["kind"], e["actor"], e["from_status"], e["to_status"]) for e in await events_of(db_url, "op-2")
    ]
    assert kinds[-2:] == [
        ("lease_expired", "effect-ledger", "submitted", "unknown"),
        ("resolved", "rec-1", "unknown", "not_applied"),
    ]
    r = await claim(client, "op-2")
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 2


async def test_unresolved_leaves_unknown_and_records_each_look_up(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await unknown(client, "op-3")
    before = len(await events_of(db_url, "op-3"))
    for n in (1, 2):
        r = await resolve(client, "op-3", "unresolved")
        assert r.status_code == 200 and r.json()["status"] == "unknown" and r.json()["resolved_by"] is None
        events = await events_of(db_url, "op-3")
        assert len(events) == before + n
        assert (events[-1]["kind"], events[-1]["actor"], events[-1]["to_status"]) == (
            "reconcile_unresolved",
            "rec-1",
            "unknown",
        )
        assert events[-1]["data"] == {"evidence": NORMALISED_EVIDENCE}
    assert (await claim(client, "op-3")).json()["code"] == "outcome_unknown"


async def test_identical_repeats_answer_200_and_change_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await unknown(client, "op-4")
    first = await resolve(client, "op-4", "committed", receipt=RECEIPT)
    count = await count_events(db_url)
    for who in ("rec-1", "rec-2"):
        again = await resolve(client, "op-4", "committed", sub=who, receipt=RECEIPT)
        assert again.status_code == 200 and again.json() == first.json()
    other_evidence = {
        "outcome": "committed",
        "receipt": RECEIPT,
        "evidence": {**EVIDENCE, "source": "ledger-b"},
    }
    r = await call(client, "op-4", "resolve", other_evidence, sub="rec-3", scope="ledger:reconcile")
    assert r.status_code == 200 and r.json() == first.json()
    await unknown(client, "op-5")
    first = await resolve(client, "op-5", "not_applied", reason=REASON)
    again = await resolve(client, "op-5", "not_applied", reason=REASON)
    assert again.status_code == 200 and again.json() == first.json()
    assert await count_events(db_url) == count + len(await events_of(db_url, "op-5"))


async def test_a_different_outcome_is_409_and_recorded_as_discrepancy(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await unknown(client, "op-6")
    await resolve(client, "op-6", "committed", receipt=RECEIPT)
    attempts: list[dict[str, Any]] = [
        {"reason": REASON},  # not_applied
        {"receipt": {**RECEIPT, "external_ref": "m-8"}},  # committed with another receipt
    ]
    for outcome, extra in zip(("not_applied", "committed"), attempts, strict=True):
        before = len(await events_of(db_url, "op-6"))
        r = await resolve(client, "op-6", outcome, sub="rec-2", **extra)
        assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"
        assert r.json()["operation"]["status"] == "committed"
        events = await events_of(db_url, "op-6")
        assert len(events) == before + 1
        last = events[-1]
        assert (last["kind"], last["actor"], last["from_status"], last["to_status"]) == (
            "discrepancy",
            "rec-2",
            "committed",
            "committed",
        )
        assert last["data"]["source"] == "resolve" and last["data"]["reported_outcome"] == outcome
        assert last["data"]["recorded_outcome"] == "committed"
    assert await stored_status(db_url, "op-6") == "committed"


async def test_pending_and_live_submitted_are_invalid_transitions(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await pending(client, "op-p")
    await submitted(client, "op-s")
    count = await count_events(db_url)
    for op, status in (("op-p", "pending"), ("op-s", "submitted")):
        for outcome, extra in (("committed", {"receipt": RECEIPT}), ("unresolved", {})):
            r = await resolve(client, op, outcome, **extra)
            assert r.status_code == 409 and r.json()["code"] == "invalid_transition"
            assert r.json()["operation"]["status"] == status
    assert await count_events(db_url) == count


async def test_late_report_disagreeing_with_the_resolution_is_409_and_recorded(
    client: httpx.AsyncClient, db_url: str
) -> None:
    token = await unknown(client, "op-7")
    await resolve(client, "op-7", "not_applied", reason=REASON)
    late = {"token": token, "outcome": "committed", "receipt": RECEIPT}
    r = await call(client, "op-7", "complete", late)
    assert r.status_code == 409 and r.json()["code"] == "conflicting_outcome"
    assert r.json()["operation"]["status"] == "not_applied"
    last = (await events_of(db_url, "op-7"))[-1]
    assert (last["kind"], last["actor"], last["data"]["source"]) == ("discrepancy", "exec-1", "complete")
    assert last["data"]["reported_receipt"]["external_ref"] == "m-7"
    count = await count_events(db_url)
    agreeing = await call(
        client, "op-7", "complete", {"token": token, "outcome": "not_applied", "reason": REASON}
    )
    assert agreeing.status_code == 200 and agreeing.json()["resolved_by"] == "rec-1"
    assert await count_events(db_url) == count


async def test_concurrent_reconcilers_exactly_one_changes_the_operation(service: Any, db_url: str) -> None:
    async with service.client(limits=httpx.Limits(max_connections=20)) as http:
        for n in range(8):
            same, different = f"same-{n}", f"diff-{n}"
            await unknown(http, same)
            await unknown(http, different)
            answers = await asyncio.gather(
                resolve(http, same, "committed", sub="rec-a", receipt=RECEIPT),
                resolve(http, same, "committed", sub="rec-b", receipt=RECEIPT),
            )
            assert [a.status_code for a in answers] == [200, 200]
            kinds = [e["kind"] for e in await events_of(db_url, same)]
            assert kinds.count("resolved") == 1 and "discrepancy" not in kinds
            assert answers[0].json()["resolved_by"] == answers[1].json()["resolved_by"]

            answers = await asyncio.gather(
                resolve(http, different, "committed", sub="rec-a", receipt=RECEIPT),
                resolve(http, different, "not_applied", sub="rec-b", reason=REASON),
            )
            codes = sorted(a.status_code for a in answers)
            assert codes == [200, 409]
            winner = next(a for a in answers if a.status_code == 200).json()
            loser = next(a for a in answers if a.status_code == 409).json()
            assert loser["code"] == "conflicting_outcome" and loser["operation"] == winner
            kinds = [e["kind"] for e in await events_of(db_url, different)]
            assert kinds.count("resolved") == 1 and kinds.count("discrepancy") == 1
            assert await stored_status(db_url, different) == winner["status"]


async def test_resolve_validates_its_body(client: httpx.AsyncClient) -> None:
    await unknown(client, "op-v")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"outcome": "committed", "receipt": RECEIPT}, "evidence"),
        ({"outcome": "committed", "evidence": EVIDENCE}, "receipt"),
        ({"outcome": "not_applied", "evidence": EVIDENCE}, "reason"),
        ({"outcome": "unresolved", "evidence": EVIDENCE, "receipt": RECEIPT}, "receipt"),
        ({"outcome": "unknown", "evidence": EVIDENCE}, "outcome"),
        (
            {"outcome": "unresolved", "evidence": {**EVIDENCE, "checked_at": "yesterday"}},
            "evidence.checked_at",
        ),
        ({"outcome": "unresolved", "evidence": {**EVIDENCE, "note": "x"}}, "evidence.note"),
        (
            {"outcome": "unresolved", "evidence": {"lookup_ref": None, "checked_at": "2026-11-30T10:00:00Z"}},
            "evidence.source",
        ),
        ({"outcome": "unresolved", "evidence": EVIDENCE, "token": "x"}, "token"),
    ]
    for body, field in cases:
        r = await call(client, "op-v", "resolve", body, sub="rec-1", scope="ledger:reconcile")
        assert r.status_code == 422, (body, r.text)
        assert r.json()["code"] == "validation_failed"
        assert field in [e["field"] for e in r.json()["errors"]], (body, r.json())


async def test_resolve_needs_reconcile_scope_and_hides_other_tenants(client: httpx.AsyncClient) -> None:
    await unknown(client, "op-x")
    body = {"outcome": "unresolved", "evidence": EVIDENCE}
    for scope in ("ledger:execute", "ledger:audit"):
        r = await client.post("/v1/operations/op-x/resolve", json=body, headers=auth(scope=scope))
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = await resolve(client, "op-x", "unresolved", tenant="t2")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = await resolve(client, "op-none", "unresolved")
    assert r.status_code == 404


async def test_unresolved_on_a_terminal_operation_is_200_and_records_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await unknown(client, "op-t1")
    await resolve(client, "op-t1", "committed", receipt=RECEIPT)
    await unknown(client, "op-t2")
    await resolve(client, "op-t2", "not_applied", reason=REASON)
    for op, status in (("op-t1", "committed"), ("op-t2", "not_applied")):
        before = await events_of(db_url, op)
        view = (await client.get(f"/v1/operations/{op}", headers=auth(scope="ledger:reconcile"))).json()
        r = await resolve(client, op, "unresolved", sub="rec-9")
        # the same view (GET also looks the receipt up in the log: log_index, API.md section 14)
        assert r.status_code == 200 and {**r.json(), "log_index": view["log_index"]} == view
        assert r.json()["status"] == status and r.json()["resolved_by"] != "rec-9"
        assert await events_of(db_url, op) == before
