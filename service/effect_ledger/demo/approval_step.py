"""The demo's approval step (API.md section 15): a charge waits for a second principal's yes, then runs
once; a second run is cancelled while its approval is pending and never executes — even though the
approval then arrives (the seed's counterexample: a run cancelled during the approval wait executed
once). The approval the cancelled run never used stays unconsumed."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Protocol

from effect_ledger.client import ApprovalView, EffectCancelled, LedgerClient, OperationView, Receipt

APPROVER = "lead-1"
CHARGE_TOOL = "payments.charge"
# The demo service's policy: charges need one approver's yes, valid five minutes.
POLICY = {"default": [{"tool": CHARGE_TOOL, "required": 1, "ttl_seconds": 300}]}
WAIT_S = 20.0


class Timeline(Protocol):
    """What the step needs of the scenario's timeline."""

    def add(self, actor: str, action: str, view: OperationView | None = None) -> None:
        """One step, printed as it happens."""

    def expect(self, what: str, held: bool) -> None:
        """One expectation, checked at the end."""


async def _pending(approver: LedgerClient, operation_id: str) -> ApprovalView:
    """The approver's view of the operation's pending request, once the executor's claim made it."""
    for _ in range(500):
        async for request in approver.approvals.pending():
            if request.operation_id == operation_id:
                return request
        await asyncio.sleep(0.02)
    raise RuntimeError(f"no approval request for {operation_id} appeared")


async def run_approval_step(
    executor: LedgerClient, approver: LedgerClient, timeline: Timeline, executor_name: str
) -> None:
    """The approved charge, then the cancelled one; the charges counted by the fake payment provider."""
    charges: Counter[str] = Counter()

    async def charge(operation_id: str, cancelled: asyncio.Event | None = None) -> None:
        intent = {"customer": "cus-77", "amount": 4200, "currency": "EUR", "order": operation_id}
        effect = executor.effect(
            operation_id,
            tool=CHARGE_TOOL,
            tool_version="1",
            intent=intent,
            approval_wait_seconds=WAIT_S,
            approval_note="over the automatic limit",
            cancelled=cancelled,
        )
        async with effect:
            timeline.add(executor_name, f"approval came: claim {operation_id} -> execute", effect.operation)
            await effect.submitted(effect_ref=f"psp-{operation_id}")
            charges[operation_id] += 1
            effect.commit(Receipt(external_ref=f"ch_{operation_id}"))
        timeline.add(executor_name, f"charge {operation_id} once, commit ch_{operation_id}", effect.operation)

    timeline.add(executor_name, f"claim charge-1 ({CHARGE_TOOL}) -> 403 approval_required, wait")
    run = asyncio.create_task(charge("charge-1"))
    request = await _pending(approver, "charge-1")
    timeline.add(APPROVER, f"pending: charge-1 from {request.principal} (note: {request.note})")
    await approver.approvals.decide(request.approval_id, "approve", "checked with the customer")
    timeline.add(APPROVER, "approve charge-1")
    await asyncio.wait_for(run, WAIT_S + 5)
    first = await approver.approvals.get(request.approval_id)
    timeline.expect(
        "charge-1 waited for lead-1's yes, then ran once; the approval was consumed by attempt 1",
        charges["charge-1"] == 1 and (first.status, first.consumed_by_attempt) == ("consumed", 1),
    )

    cancel = asyncio.Event()
    timeline.add(executor_name, "claim charge-2 -> 403 approval_required, wait")
    run = asyncio.create_task(charge("charge-2", cancel))
    request = await _pending(approver, "charge-2")
    cancel.set()
    timeline.add(executor_name, "the run is cancelled while charge-2 waits for approval")
    await approver.approvals.decide(request.approval_id, "approve", "fine")
    timeline.add(APPROVER, "approve charge-2 (too late: the run was cancelled)")
    cancelled = False
    try:
        await asyncio.wait_for(run, WAIT_S + 5)
    except EffectCancelled:
        cancelled = True
    second = await approver.approvals.get(request.approval_id)
    timeline.add(executor_name, f"charge-2: nothing claimed or charged; its approval stays {second.status}")
    timeline.expect(
        "the run cancelled during its approval wait never executed, and left the approval unconsumed",
        cancelled
        and charges["charge-2"] == 0
        and (second.status, second.consumed_by_attempt) == ("approved", None),
    )
