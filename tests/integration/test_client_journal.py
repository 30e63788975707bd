"""The Python client's journal calls and the orchestrator's reopen, against the real service."""

from __future__ import annotations

import httpx
import pytest

from effect_ledger.client import (
    InvalidHistory,
    LedgerClient,
    NotFound,
    RevisionConflict,
    UnsupportedSchema,
    message,
    reopen,
    tool_call,
    tool_result,
)
from support.auth import auth, token
from support.ledger import committed, expire_lease, not_applied, pending, submitted, unknown
from support.server import Service

SCOPES = "journal:write journal:read"


def orchestrator(service: Service, sub: str = "orch-1") -> LedgerClient:
    return LedgerClient(service.base_url, token("t1", sub, SCOPES))


async def test_typed_calls_and_their_problems(service: Service) -> None:
    async with orchestrator(service) as client:
        journal = client.journal
        created = await journal.create_session({"task": "compare"})
        sid = created.session_id
        assert created.revision == 0 and created.schema == 1
        batch = [message("user", "compare A and B"), tool_call("c1", "measure", {"p": "A"}, "m-a")]
        first = await journal.append(sid, 0, batch, client_nonce="nonce-for-the-client-test")
        again = await journal.append(sid, 0, batch, client_nonce="nonce-for-the-client-test")
        assert (first.revision, first.replayed) == (2, False) and (again.revision, again.replayed) == (
            2,
            True,
        )
        with pytest.raises(RevisionConflict) as conflict:
            await journal.append(sid, 0, [message("user", "late")])
        assert conflict.value.revision == 2
        with pytest.raises(InvalidHistory) as invalid:
            await journal.append(sid, 2, [message("assistant", "too early")])
        assert invalid.value.errors[0]["index"] == 0
        with pytest.raises(UnsupportedSchema):
            await journal.append(sid, 2, [{**tool_result("c1", "measure", 1), "schema": 3}])
        await journal.append(sid, 2, [tool_result("c1", "measure", {"v": 41.7})])
        snap = await journal.read(sid)
        assert (
            snap.revision == 3
            and snap.labels == {"task": "compare"}
            and snap.results() == {"c1": {"v": 41.7}}
        )
        assert [r["seq"] for r in (await journal.read(sid, after_seq=1)).records] == [2, 3]
        projection = await journal.projection(sid)
        assert projection.calls[0].resume == "none" and projection.calls[0].effect == {"status": "absent"}
        context = await journal.context(sid, max_records=3)
        assert context.omitted.records == 0 and [r["seq"] for r in context.records] == [1, 2, 3]
        await journal.delete(sid)
        with pytest.raises(NotFound):
            await journal.read(sid)


async def test_reopen_plans_every_pending_call_and_does_none_of_it(
    service: Service, client: httpx.AsyncClient, db_url: str
) -> None:
    await committed(client, "op-done")
    await unknown(client, "op-unknown")
    await submitted(client, "op-expired")
    await expire_lease(db_url, "op-expired")
    await pending(client, "op-live")
    await not_applied(client, "op-refused")
    links = {
        "c-done": "op-done",
        "c-unknown": "op-unknown",
        "c-expired": "op-expired",
        "c-live": "op-live",
        "c-refused": "op-refused",
        "c-new": "op-new",
        "c-none": None,
    }
    async with orchestrator(service) as orch:
        sid = (await orch.journal.create_session()).session_id
        calls = [tool_call(cid, "measure", {}, op) for cid, op in links.items()]
        await orch.journal.append(sid, 0, [message("user", "go"), *calls])
        plan = await reopen(orch, sid)
        assert plan.revision == 8 and not plan.settled
        assert [c.call_id for c in plan.answer_from_receipt] == ["c-done"]
        assert plan.answer_from_receipt[0].receipt is not None
        assert [c.call_id for c in plan.reconcile] == ["c-unknown", "c-expired"]
        assert [c.call_id for c in plan.may_claim_again] == ["c-refused", "c-new"]
        assert [c.call_id for c in plan.wait] == ["c-live"]
        assert [c.call_id for c in plan.no_operation] == ["c-none"]
        assert plan.action_of("c-expired") == "reconcile" and plan.action_of("nope") is None
        again = await reopen(orch, sid)
        assert again == plan  # reopening is a read: the same revision gives the same plan
        assert (await orch.journal.read(sid)).revision == 8
        # nothing was claimed for the call the plan says may be claimed again
        assert (await client.get("/v1/operations/op-new", headers=auth())).status_code == 404
