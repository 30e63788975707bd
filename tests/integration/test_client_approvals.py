"""The client and approvals (API.md section 15): effect() waits for the decision within its deadline,
checks cancellation after the wait and before the claim that would consume the approval; the seed's
counterexample (a run cancelled while its approval is pending executes once) is a regression here.
Approvers review the pending queue with the client's helper."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from effect_ledger.client import (
    ApprovalDenied,
    ApprovalRequired,
    Approvals,
    ApprovalView,
    EffectCancelled,
    LedgerClient,
    NotFound,
    Receipt,
)
from effect_ledger.settings import Settings
from support.auth import token
from support.server import Service

POLICY = {"default": [{"tool": "charge", "required": 1, "ttl_seconds": 600}]}
CHARGE: dict[str, Any] = {"tool": "charge", "tool_version": "1", "intent": {"amount": 42}}


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    async with Service(replace(settings, approval_policy=json.dumps(POLICY))) as running:
        yield running


def executor(service: Service) -> LedgerClient:
    return LedgerClient(service.base_url, token(sub="exec-1", scope="ledger:execute"))


def approver(service: Service, sub: str = "ap-1") -> LedgerClient:
    return LedgerClient(service.base_url, token(sub=sub, scope="ledger:approve ledger:audit"))


async def first_pending(approvals: LedgerClient, within: float = 10.0) -> ApprovalView:
    """The first pending request, once the executor's claim has made it."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while loop.time() < end:
        page = await approvals.approvals.page(status="pending")
        if page.items:
            return page.items[0]
        await asyncio.sleep(0.02)
    raise AssertionError("no pending approval request appeared")


async def test_effect_waits_for_the_approval_and_runs_once(service: Service) -> None:
    runs = 0

    async def run() -> None:
        nonlocal runs
        async with executor(service) as ledger:
            async with ledger.effect("pay-1", **CHARGE, approval_wait_seconds=20) as effect:
                assert effect.claim is not None and effect.approval_waits == 1
                runs += 1
                await effect.submitted(effect_ref="psp-1")
                effect.commit(Receipt(external_ref="psp-1"))

    task = asyncio.create_task(run())
    async with approver(service) as approvals:
        pending = await first_pending(approvals)
        assert (pending.operation_id, pending.principal, pending.intent) == (
            "pay-1",
            "exec-1",
            {"amount": 42},
        )
        await approvals.approvals.decide(pending.approval_id, "approve", "looks right")
        await asyncio.wait_for(task, 20)
        assert runs == 1
        view = await approvals.approvals.get(pending.approval_id)
        assert (view.status, view.consumed_by_attempt) == ("consumed", 1)


@pytest.mark.parametrize("order", ["cancel_then_approve", "approve_then_cancel"])
async def test_cancelled_during_the_wait_runs_nothing_and_leaves_the_approval_unconsumed(
    service: Service, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = 0
    cancel = asyncio.Event()
    if order == "approve_then_cancel":
        # The cancellation lands exactly as the wait ends with the approval in hand: only the
        # recheck between the wait and the consuming claim can stop it.
        original = Approvals.wait_for_decision

        async def wait_then_cancel(self: Approvals, *args: Any, **kwargs: Any) -> ApprovalView | None:
            view = await original(self, *args, **kwargs)
            assert view is not None and view.status == "approved"
            cancel.set()
            return view

        monkeypatch.setattr(Approvals, "wait_for_decision", wait_then_cancel)

    async def run() -> None:
        nonlocal runs
        async with executor(service) as ledger:
            async with ledger.effect("pay-c", **CHARGE, approval_wait_seconds=20, cancelled=cancel):
                runs += 1

    task = asyncio.create_task(run())
    async with approver(service) as approvals:
        pending = await first_pending(approvals)
        if order == "cancel_then_approve":
            cancel.set()
        await approvals.approvals.decide(pending.approval_id, "approve")
        with pytest.raises(EffectCancelled):
            await asyncio.wait_for(task, 20)
        assert runs == 0
        view = await approvals.approvals.get(pending.approval_id)
        assert (view.status, view.consumed_by_attempt) == ("approved", None)
        events = await approvals.approvals.events(pending.approval_id)
        assert [e["kind"] for e in events] == ["requested", "approved"]
        with pytest.raises(NotFound):
            await approvals.get_operation("pay-c")


async def test_a_cancelled_task_sends_no_claim_after_the_wait(service: Service) -> None:
    runs = 0

    async def run() -> None:
        nonlocal runs
        async with executor(service) as ledger:
            async with ledger.effect("pay-t", **CHARGE, approval_wait_seconds=20):
                runs += 1

    task = asyncio.create_task(run())
    async with approver(service) as approvals:
        pending = await first_pending(approvals)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await approvals.approvals.decide(pending.approval_id, "approve")
        await asyncio.sleep(0.3)
        assert runs == 0
        assert (await approvals.approvals.get(pending.approval_id)).status == "approved"


async def test_no_wait_past_the_deadline_and_a_denial_stops_it(service: Service) -> None:
    async with executor(service) as ledger:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ApprovalRequired) as needed:
            async with ledger.effect("pay-d", **CHARGE, approval_wait_seconds=0.6):
                raise AssertionError("the body must not run")
        assert 0.5 <= loop.time() - started < 5
        # backoff, not a busy poll: a handful of reads in 0.6 s
        assert ledger.stats.calls <= 8
        approval_id = needed.value.approval_id
        assert approval_id is not None
        async with approver(service) as approvals:
            await approvals.approvals.decide(approval_id, "deny", "no")
        with pytest.raises(ApprovalDenied):
            async with ledger.effect("pay-d", **CHARGE, approval_wait_seconds=5):
                raise AssertionError("the body must not run")


async def test_review_helper_decides_the_pending_queue(service: Service) -> None:
    async with executor(service) as ledger:
        for op, amount in (("pay-r1", 10), ("pay-r2", 10_000), ("pay-r3", 50)):
            with pytest.raises(ApprovalRequired):
                await ledger.claim(op, tool="charge", tool_version="1", intent={"amount": amount})

    async def judge(request: ApprovalView) -> tuple[Any, str] | None:
        amount = request.intent["amount"]
        if amount >= 10_000:
            return ("deny", "too large")
        if amount >= 50:
            return None  # a person decides
        return ("approve", "small")

    async with approver(service) as approvals:
        report = await approvals.approvals.review(judge)
        ops = {a.approval_id: a.operation_id for a in (await approvals.approvals.page()).items}
        assert [ops[i] for i in report.approved] == ["pay-r1"]
        assert [ops[i] for i in report.denied] == ["pay-r2"]
        assert [ops[i] for i in report.skipped] == ["pay-r3"]
        assert report.failed == {}
