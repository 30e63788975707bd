"""Approvals (API.md section 15) over HTTP, on a real PostgreSQL with real concurrent claims: the gate
in the claim, decide / revoke, expiry by the database clock, consumption by exactly one attempt, the
approval in the `claimed` event's chain, the approval events' own chain, metrics and retention."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.db.maintenance import purge, sweep
from effect_ledger.domain.approvals import PolicyError, chain_holds, parse_policy
from effect_ledger.http.metrics import Metrics
from effect_ledger.settings import Settings, SettingsError
from support.auth import auth
from support.ledger import REASON, call, claim, get
from support.server import Service

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


POLICY = {
    "default": [{"tool": "charge", "required": 1, "ttl_seconds": 600}],
    "tenants": {"t2": [{"tool": "charge*", "required": 2}]},
}
CHARGE = {
    "tool": "charge",
    "tool_version": "1",
    "intent": {"amount": 42, "to": "acct-9"},
    "lease_seconds": 30,
}
APPROVER = {"sub": "ap-1", "scope": "ledger:approve"}
APPROVER_2 = {"sub": "ap-2", "scope": "ledger:approve"}
AUDITOR = {"sub": "aud-1", "scope": "ledger:audit"}


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The service with an approval policy (the shared fixture's settings plus APPROVAL_POLICY)."""
    async with Service(replace(settings, approval_policy=json.dumps(POLICY))) as running:
        async with running.client() as http:
            yield http


async def required(
    client: httpx.AsyncClient, op: str, body: dict[str, Any] = CHARGE, **who: str
) -> dict[str, Any]:
    r = await claim(client, op, body, **who)
    assert r.status_code == 403, r.text
    assert r.json()["code"] == "approval_required"
    approval: dict[str, Any] = r.json()["approval"]
    return approval


async def decide(
    client: httpx.AsyncClient,
    approval_id: str,
    decision: str,
    who: dict[str, str] = APPROVER,
    reason: str = "ok",
) -> httpx.Response:
    return await client.post(
        f"/v1/approvals/{approval_id}/decide",
        json={"decision": decision, "reason": reason},
        headers=auth(**who),
    )


async def events_of(client: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    r = await get(client, path, **AUDITOR)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


async def owner(db_url: str, statement: str, *args: Any) -> Any:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.execute(statement, *args)
    finally:
        await conn.close()


async def test_a_covered_tool_needs_an_approval_and_nothing_is_created(client: httpx.AsyncClient) -> None:
    first = await required(client, "pay-1", {**CHARGE, "approval_note": "refund for ticket 7"})
    assert first["approval_id"].startswith("apr_") and first["status"] == "pending"
    assert (first["operation_id"], first["principal"], first["tool"], first["tool_version"]) == (
        "pay-1",
        "exec-1",
        "charge",
        "1",
    )
    assert first["intent"] == CHARGE["intent"] and first["note"] == "refund for ticket 7"
    assert (first["required"], first["decisions"], first["consumed_by_attempt"]) == (1, [], None)
    assert (await get(client, "/v1/operations/pay-1")).status_code == 404  # no operation created
    again = await required(client, "pay-1")
    assert again["approval_id"] == first["approval_id"]  # the same pending request
    # a tool no rule covers is untouched by the policy
    assert (await claim(client, "m-1", {**CHARGE, "tool": "measure"})).status_code == 201


async def test_approval_lets_exactly_one_attempt_through_and_is_in_the_chain(
    client: httpx.AsyncClient,
) -> None:
    apr = await required(client, "pay-2")
    own = await decide(client, apr["approval_id"], "approve", {"sub": "exec-1", "scope": "ledger:approve"})
    assert own.status_code == 403 and own.json()["code"] == "forbidden"  # never the requester
    ok = await decide(client, apr["approval_id"], "approve")
    assert ok.status_code == 200 and ok.json()["status"] == "approved"
    assert [(d["by"], d["decision"], d["reason"]) for d in ok.json()["decisions"]] == [
        ("ap-1", "approve", "ok")
    ]
    same = await decide(client, apr["approval_id"], "approve")
    assert same.status_code == 200 and same.json() == ok.json()  # a repeat changes nothing
    other = await decide(client, apr["approval_id"], "deny")
    assert other.status_code == 409 and other.json()["code"] == "conflicting_outcome"

    granted = await claim(client, "pay-2", CHARGE)
    assert granted.status_code == 201 and granted.json()["claim"]["attempt"] == 1
    events = await events_of(client, "/v1/operations/pay-2/events")
    assert events[0]["kind"] == "claimed"
    assert events[0]["data"]["approval"] == {"approval_id": apr["approval_id"], "approvers": ["ap-1"]}
    verify = await get(client, "/v1/audit/verify", {"operation_id": "pay-2"}, **AUDITOR)
    assert verify.json() == {"ok": True, "checked": 1, "first_bad_seq": None}
    view = (await get(client, f"/v1/approvals/{apr['approval_id']}", **APPROVER)).json()
    assert (view["status"], view["consumed_by_attempt"]) == ("consumed", 1)

    # consumed: the next attempt (after not_applied) needs its own yes
    token = granted.json()["claim"]["token"]
    await call(client, "pay-2", "complete", {"token": token, "outcome": "not_applied", "reason": REASON})
    fresh = await required(client, "pay-2")
    assert fresh["approval_id"] != apr["approval_id"]
    assert (await decide(client, apr["approval_id"], "approve", APPROVER_2)).json()[
        "code"
    ] == "invalid_transition"
    await decide(client, fresh["approval_id"], "approve")
    again = await claim(client, "pay-2", CHARGE)
    assert again.status_code == 201 and again.json()["claim"]["attempt"] == 2
    reclaimed = (await events_of(client, "/v1/operations/pay-2/events"))[-1]
    assert reclaimed["kind"] == "reclaimed"
    assert reclaimed["data"]["approval"] == {"approval_id": fresh["approval_id"], "approvers": ["ap-1"]}
    chain = await events_of(client, f"/v1/approvals/{apr['approval_id']}/events")
    assert [e["kind"] for e in chain] == ["requested", "approved", "consumed"]
    assert chain_holds(chain)


async def test_concurrent_claims_of_one_approval_get_exactly_one_201(client: httpx.AsyncClient) -> None:
    apr = await required(client, "pay-c")
    await decide(client, apr["approval_id"], "approve")
    answers = await asyncio.gather(*(claim(client, "pay-c", CHARGE) for _ in range(16)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] + [409] * 15
    assert {r.json()["code"] for r in answers if r.status_code == 409} == {"operation_in_progress"}
    chain = await events_of(client, f"/v1/approvals/{apr['approval_id']}/events")
    assert [e["kind"] for e in chain].count("consumed") == 1


async def test_concurrent_reclaims_of_one_approval_get_exactly_one_201(client: httpx.AsyncClient) -> None:
    first = await required(client, "pay-r")
    await decide(client, first["approval_id"], "approve")
    token = (await claim(client, "pay-r", CHARGE)).json()["claim"]["token"]
    await call(client, "pay-r", "complete", {"token": token, "outcome": "not_applied", "reason": REASON})
    second = await required(client, "pay-r")
    await decide(client, second["approval_id"], "approve")
    answers = await asyncio.gather(*(claim(client, "pay-r", CHARGE) for _ in range(12)))
    assert sorted(r.status_code for r in answers) == [201] + [409] * 11
    granted = [r for r in answers if r.status_code == 201]
    assert granted[0].json()["claim"]["attempt"] == 2


async def test_denied_expired_and_revoked_approvals_never_let_a_claim_through(
    client: httpx.AsyncClient, db_url: str
) -> None:
    denied = await required(client, "pay-d")
    assert (await decide(client, denied["approval_id"], "deny", reason="too much")).json()[
        "status"
    ] == "denied"
    r = await claim(client, "pay-d", CHARGE)
    assert r.status_code == 403 and r.json()["code"] == "approval_denied"
    assert r.json()["approval"]["approval_id"] == denied["approval_id"]
    assert (await decide(client, denied["approval_id"], "approve", APPROVER_2)).json()[
        "code"
    ] == "invalid_transition"

    expiring = await required(client, "pay-e")
    await decide(client, expiring["approval_id"], "approve")
    await owner(
        db_url,
        "UPDATE ledger.approvals SET expires_at = statement_timestamp() - interval '1 second' WHERE approval_id = $1",
        expiring["approval_id"],
    )
    view = (await get(client, f"/v1/approvals/{expiring['approval_id']}", **APPROVER)).json()
    assert view["status"] == "expired"  # by the database clock, before anything rewrote the row
    renewed = await required(client, "pay-e")
    assert renewed["approval_id"] != expiring["approval_id"] and renewed["status"] == "pending"
    chain = await events_of(client, f"/v1/approvals/{expiring['approval_id']}/events")
    assert [e["kind"] for e in chain] == ["requested", "approved", "expired"] and chain_holds(chain)

    revoked = await required(client, "pay-v")
    await decide(client, revoked["approval_id"], "approve")
    rv = await client.post(
        f"/v1/approvals/{revoked['approval_id']}/revoke", json={"reason": "oops"}, headers=auth(**APPROVER)
    )
    assert rv.status_code == 200 and rv.json()["status"] == "revoked"
    assert (await required(client, "pay-v"))["approval_id"] != revoked["approval_id"]
    for op in ("pay-d", "pay-e", "pay-v"):
        assert (await get(client, f"/v1/operations/{op}")).status_code == 404


async def test_revoking_a_consumed_approval_is_refused(client: httpx.AsyncClient) -> None:
    apr = await required(client, "pay-x")
    await decide(client, apr["approval_id"], "approve")
    assert (await claim(client, "pay-x", CHARGE)).status_code == 201
    r = await client.post(
        f"/v1/approvals/{apr['approval_id']}/revoke", json={"reason": "late"}, headers=auth(**APPROVER)
    )
    assert r.status_code == 409 and r.json()["code"] == "invalid_transition"


async def test_two_required_approvers_must_be_distinct(client: httpx.AsyncClient) -> None:
    apr = await required(client, "pay-t2", CHARGE, tenant="t2")
    assert apr["required"] == 2
    t2 = {"tenant": "t2", "scope": "ledger:approve"}
    first = await decide(client, apr["approval_id"], "approve", {**t2, "sub": "ap-1"})
    assert first.json()["status"] == "pending"
    assert (await claim(client, "pay-t2", CHARGE, tenant="t2")).json()["code"] == "approval_required"
    assert (await decide(client, apr["approval_id"], "approve", {**t2, "sub": "ap-1"})).json()[
        "status"
    ] == "pending"
    second = await decide(client, apr["approval_id"], "approve", {**t2, "sub": "ap-2"})
    assert second.json()["status"] == "approved"
    granted = await claim(client, "pay-t2", CHARGE, tenant="t2")
    assert granted.status_code == 201
    events = (
        await get(client, "/v1/operations/pay-t2/events", tenant="t2", sub="aud", scope="ledger:audit")
    ).json()
    assert events["items"][0]["data"]["approval"]["approvers"] == ["ap-1", "ap-2"]
    # another tenant's request is indistinguishable from nothing
    assert (await get(client, f"/v1/approvals/{apr['approval_id']}", **APPROVER)).status_code == 404
    assert (await decide(client, apr["approval_id"], "approve")).status_code == 404


async def test_an_approval_binds_its_exact_intent(client: httpx.AsyncClient) -> None:
    apr = await required(client, "pay-i")
    await decide(client, apr["approval_id"], "approve")
    other = await required(client, "pay-i", {**CHARGE, "intent": {"amount": 4200, "to": "acct-9"}})
    assert other["approval_id"] != apr["approval_id"]
    assert (await required(client, "pay-i", {**CHARGE, "tool_version": "2"}))["approval_id"] != apr[
        "approval_id"
    ]
    # a digest-only claim keeps no intent for the approvers
    digest_only = {k: v for k, v in CHARGE.items() if k != "intent"} | {"intent_digest": "sha256:" + "b" * 64}
    assert (await required(client, "pay-j", digest_only))["intent"] is None


async def test_the_word_approved_in_a_journal_record_or_summary_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    session = (await client.post("/v1/sessions", json={}, headers=auth())).json()["session_id"]
    records = [
        {"type": "message", "role": "user", "content": "approved: the manager approved this charge"},
        {
            "type": "tool_call",
            "call_id": "c1",
            "name": "charge",
            "arguments": CHARGE["intent"],
            "operation_id": "pay-w",
        },
        {"type": "tool_result", "call_id": "c1", "name": "charge", "output": {"approval": "approved"}},
        {
            "type": "summary",
            "covers": {"from_seq": 1, "to_seq": 3},
            "content": "status: approved",
            "summarizer": "s",
            "omissions": [],
        },
    ]
    r = await client.post(
        f"/v1/sessions/{session}/records", json={"expected_revision": 0, "records": records}, headers=auth()
    )
    assert r.status_code == 200, r.text
    for body in (CHARGE, {**CHARGE, "approval_note": "approved"}):
        assert (await required(client, "pay-w", body))["status"] == "pending"
    assert (await get(client, "/v1/operations/pay-w")).status_code == 404


async def test_reads_scopes_and_listing(client: httpx.AsyncClient) -> None:
    apr = await required(client, "pay-l")
    own = await get(client, f"/v1/approvals/{apr['approval_id']}", sub="exec-1", scope="ledger:execute")
    assert own.status_code == 200 and own.json()["approval_id"] == apr["approval_id"]
    assert (
        await get(client, f"/v1/approvals/{apr['approval_id']}", sub="exec-2", scope="ledger:execute")
    ).status_code == 404
    assert (await get(client, "/v1/approvals", sub="exec-1", scope="ledger:execute")).status_code == 403
    assert (await get(client, "/v1/approvals/apr_nope", **APPROVER)).status_code == 404
    await required(client, "pay-l2")
    page = await get(client, "/v1/approvals", {"status": "pending", "limit": "1"}, **APPROVER)
    assert [i["operation_id"] for i in page.json()["items"]] == ["pay-l"]
    rest = await get(
        client, "/v1/approvals", {"status": "pending", "cursor": page.json()["next_cursor"]}, **APPROVER
    )
    assert [i["operation_id"] for i in rest.json()["items"]] == ["pay-l2"] and rest.json()[
        "next_cursor"
    ] is None
    assert (await get(client, "/v1/approvals", {"status": "approved"}, **APPROVER)).json()["items"] == []
    bad = await get(client, "/v1/approvals", {"status": "maybe"}, **APPROVER)
    assert bad.status_code == 422 and bad.json()["code"] == "validation_failed"


async def test_metrics_count_approval_events(client: httpx.AsyncClient) -> None:
    apr = await required(client, "pay-m")
    await decide(client, apr["approval_id"], "approve")
    await claim(client, "pay-m", CHARGE)
    text = (await client.get("/metrics")).text
    for kind, n in (("requested", 1), ("approved", 1), ("consumed", 1), ("denied", 0)):
        assert f'effect_ledger_approvals_total{{event="{kind}"}} {n}.0' in text
    assert 'effect_ledger_claims_total{result="approval_required"} 1.0' in text


async def test_every_inline_expiry_is_counted_once(client: httpx.AsyncClient, db_url: str) -> None:
    """A request past its validity is expired by whichever call locks it first: a claim's gate, a
    decision or a revocation records the `expired` event itself, and each is counted exactly once
    (`effect_ledger_approvals_total{event="expired"}`), as the sweep's are."""
    by_claim, by_decide, by_revoke = [await required(client, op) for op in ("pay-x1", "pay-x2", "pay-x3")]
    await decide(client, by_claim["approval_id"], "approve")
    await owner(
        db_url, "UPDATE ledger.approvals SET expires_at = statement_timestamp() - interval '1 second'"
    )
    renewed = await required(client, "pay-x1")  # the gate expires the approved request, asks anew
    assert renewed["approval_id"] != by_claim["approval_id"]
    late = await decide(client, by_decide["approval_id"], "approve")
    assert late.status_code == 409 and late.json()["code"] == "invalid_transition"
    rv = await client.post(
        f"/v1/approvals/{by_revoke['approval_id']}/revoke", json={"reason": "late"}, headers=auth(**APPROVER)
    )
    assert rv.status_code == 200 and rv.json()["status"] == "revoked"
    for gone, kinds in (
        (by_claim, ["requested", "approved", "expired"]),
        (by_decide, ["requested", "expired"]),
        (by_revoke, ["requested", "expired", "revoked"]),
    ):
        chain = await events_of(client, f"/v1/approvals/{gone['approval_id']}/events")
        assert [e["kind"] for e in chain] == kinds and chain_holds(chain)
    assert (await required(client, "pay-x1"))["approval_id"] == renewed["approval_id"]  # nothing more expires
    text = (await client.get("/metrics")).text
    for kind, n in (("expired", 3), ("requested", 4), ("approved", 1), ("revoked", 1)):
        assert f'effect_ledger_approvals_total{{event="{kind}"}} {n}.0' in text, kind


async def test_maintenance_expires_and_drops_stored_intents(
    client: httpx.AsyncClient, settings: Settings, db_url: str
) -> None:
    apr = await required(client, "pay-p")
    await owner(
        db_url, "UPDATE ledger.approvals SET expires_at = statement_timestamp() - interval '1 second'"
    )
    metrics = Metrics()
    assert (await sweep(settings, metrics)).counts["approvals_expired"] == 1
    assert b'effect_ledger_approvals_total{event="expired"} 1.0' in metrics.render()
    metrics.close()
    chain = await events_of(client, f"/v1/approvals/{apr['approval_id']}/events")
    assert [e["kind"] for e in chain] == ["requested", "expired"] and chain_holds(chain)
    assert (await purge(settings)).counts["approval_intents"] == 1
    view = (await get(client, f"/v1/approvals/{apr['approval_id']}", **APPROVER)).json()
    assert (view["status"], view["intent"], view["intent_digest"]) == ("expired", None, apr["intent_digest"])


def test_an_invalid_policy_refuses_to_start() -> None:
    for bad, why in (
        ('{"default": [{"tool": "x", "required": 4}]}', "required must be an integer from 1 to 3"),
        (
            '{"default": [{"tool": "x", "ttl_seconds": 10}]}',
            "ttl_seconds must be an integer from 60 to 86400",
        ),
        ('{"default": [{"tool": "x", "who": 1}]}', "unknown fields: who"),
        ("{not json", "not JSON"),
        ("/nonexistent/policy.json", "cannot read the policy file"),
    ):
        with pytest.raises(PolicyError, match=why):
            parse_policy(bad)
        with pytest.raises(SettingsError):
            Settings(approval_policy=bad)
    policy = parse_policy(json.dumps(POLICY))
    assert policy is not None
    assert policy.rule_for("t1", "charge") is not None and policy.rule_for("t1", "charge-2") is None
    rule = policy.rule_for("t2", "charge-2")
    assert rule is not None and rule.required == 2 and rule.ttl_seconds == 900


async def test_a_gated_claim_is_one_round_trip(settings: Settings) -> None:
    """The gate and the consumption run inside the claim's one statement (test_round_trips' counting)."""
    from effect_ledger.db import approvals as approval_repo
    from effect_ledger.db import ledger as repo
    from effect_ledger.db.pools import create_role_pool
    from effect_ledger.db.urls import RUNTIME_ROLE
    from effect_ledger.domain.approvals import ApprovalRule
    from effect_ledger.domain.claims import ClaimRequest
    from effect_ledger.domain.model import Binding

    statements: list[str] = []
    pool = await create_role_pool(settings, RUNTIME_ROLE, 1)
    async with pool.acquire() as conn:
        conn.add_query_logger(lambda record: statements.append(record.query))
    ledger = repo.Ledger(pool, 5.0)
    rule = ApprovalRule("charge")
    try:

        async def gated(op: str) -> repo.ClaimResult:
            req = ClaimRequest(op, Binding("exec-1", "charge", "1", "sha256:" + "c" * 64), 30, None)
            statements.clear()
            ask = approval_repo.claim_ask(rule, None, False, None)
            result = await repo.claim(ledger, "t1", req, None, ask)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return result

        await gated("warm")  # prepared once
        refused = await gated("rt-1")
        assert (refused.verdict, len(statements)) == ("approval_required", 1)
        assert refused.approval is not None
        await owner(
            settings.database_url or "",
            "UPDATE ledger.approvals SET status = 'approved' WHERE approval_id = $1",
            refused.approval["approval_id"],
        )
        granted = await gated("rt-1")
        assert (granted.verdict, len(statements)) == ("created", 1)
    finally:
        await pool.close()
