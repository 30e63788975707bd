"""The console's Approvals page over plain HTTP (docs/api.md sections 13 and 15): the queue with the
intent escaped, decisions through the API's decide path with CSRF, the requester refused, scopes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest

from effect_ledger.settings import Settings
from support.auth import auth, token
from support.console import csrf_of, sign_in
from support.server import Service

POLICY = {"default": [{"tool": "payments.refund", "required": 1, "ttl_seconds": 600}]}
APPROVER = token(sub="lead-mia", scope="ledger:approve")


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with Service(replace(settings, approval_policy=json.dumps(POLICY))) as running:
        async with running.client() as http:
            yield http


async def request(http: httpx.AsyncClient, op: str, intent: object, sub: str = "refund-bot") -> str:
    body = {"tool": "payments.refund", "tool_version": "2", "intent": intent, "approval_note": "<i>note</i>"}
    r = await http.post(
        f"/v1/operations/{op}/claim", json=body, headers=auth(sub=sub, scope="ledger:execute")
    )
    assert r.status_code == 403, r.text
    return str(r.json()["approval"]["approval_id"])


async def status(http: httpx.AsyncClient, approval_id: str) -> str:
    r = await http.get(f"/v1/approvals/{approval_id}", headers={"Authorization": f"Bearer {APPROVER}"})
    return str(r.json()["status"])


async def test_queue_decide_csrf_and_the_requester(client: httpx.AsyncClient) -> None:
    first = await request(client, "refund-1", {"order": "<script>alert(1)</script>"})
    own = await request(client, "refund-2", {"order": "o-2"}, sub="lead-mia")
    signed = await sign_in(client, APPROVER, "/console/approvals")
    assert signed.status_code == 303 and signed.headers["location"] == "/console/approvals"
    page = await client.get("/console/approvals")
    assert page.status_code == 200
    assert (
        "<script>alert(1)</script>" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    )
    assert "<i>note</i>" not in page.text and "&lt;i&gt;note&lt;/i&gt;" in page.text
    assert f"/console/approvals/{first}/decide" in page.text
    assert f"/console/approvals/{own}/decide" not in page.text  # no form on one's own request
    csrf = csrf_of(page.text)
    forged = await client.post(
        f"/console/approvals/{first}/decide", data={"csrf": "forged", "decision": "approve"}
    )
    assert forged.status_code == 403 and await status(client, first) == "pending"
    mine = await client.post(f"/console/approvals/{own}/decide", data={"csrf": csrf, "decision": "approve"})
    assert mine.status_code == 403 and "someone else must decide it" in mine.text
    assert await status(client, own) == "pending"
    done = await client.post(
        f"/console/approvals/{first}/decide", data={"csrf": csrf, "decision": "approve", "reason": "ok"}
    )
    assert done.status_code == 303 and done.headers["location"] == "/console/approvals?decided=approved"
    assert await status(client, first) == "approved"
    again = await client.post(f"/console/approvals/{first}/decide", data={"csrf": csrf, "decision": "deny"})
    assert again.status_code == 409 and "the other way" in again.text
    bad = await client.post(f"/console/approvals/{own}/decide", data={"csrf": csrf, "decision": "maybe"})
    assert bad.status_code == 422


async def test_the_page_needs_ledger_approve(client: httpx.AsyncClient) -> None:
    await sign_in(client, token(sub="oncall-ana", scope="ledger:reconcile"))
    page = await client.get("/console/approvals")
    assert page.status_code == 403 and "ledger:approve" in page.text
    overview = await client.get("/console/")
    assert 'href="/console/approvals"' not in overview.text
    client.cookies.clear()
    assert (await client.get("/console/approvals")).status_code in (302, 303)
